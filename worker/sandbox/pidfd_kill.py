"""Finding processes in /proc by their uid, and killing a process found by its pid without ever
signalling a process that took the pid over.

A pid read from ``/proc`` may be reused by the time the signal is sent. The process is held by a
pidfd first, and what marked it as the one to kill is checked again through that hold: a pid
reused meanwhile fails the check, or its pidfd names the process that died, never the new one.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable, Iterator

from worker.sandbox.bounded import poll_until


def processes() -> Iterator[tuple[int, int]]:
    """(pid, uid) of every process this PID namespace shows but this one."""
    own = os.getpid()
    with os.scandir("/proc") as entries:
        for entry in entries:
            if entry.name.isdigit() and int(entry.name) != own:
                with contextlib.suppress(OSError):
                    yield int(entry.name), entry.stat(follow_symlinks=False).st_uid


def kill_checked(pid: int, still_the_one: Callable[[int], bool]) -> bool:
    """SIGKILL ``pid`` if ``still_the_one(pid)`` holds once it is held by a pidfd; whether the
    signal was sent (a process gone or refused is not an error)."""
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return False
    try:
        if not still_the_one(pid):
            return False
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        return True
    except OSError:
        return False
    finally:
        os.close(pidfd)


def kill_until_gone(
    find: Callable[[], list[int]], still_the_one: Callable[[int], bool], deadline: float
) -> int:
    """Kill (``kill_checked``) what ``find`` finds, and look again, until it finds nothing or
    ``deadline`` passes; returns how many processes were killed."""
    # A process killed runs on until the kernel ends it (longer on a loaded machine): the next
    # look finds it again and signals it again, and it counts once.
    killed: set[int] = set()

    def gone() -> bool:
        found = find()
        killed.update(pid for pid in found if kill_checked(pid, still_the_one))
        return not found

    poll_until(gone, deadline)
    return len(killed)


def owned_by(uid: int) -> Callable[[int], bool]:
    """The check that a process is ``uid``'s (its ``/proc`` entry, links never followed)."""

    def check(pid: int) -> bool:
        return os.stat(f"/proc/{pid}", follow_symlinks=False).st_uid == uid

    return check
