"""Killing a process found by its pid, without ever signalling a process that took the pid over.

A pid read from ``/proc`` may be reused by the time the signal is sent. The process is held by a
pidfd first, and what marked it as the one to kill is checked again through that hold: a pid
reused meanwhile fails the check, or its pidfd names the process that died, never the new one.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable


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


def owned_by(uid: int) -> Callable[[int], bool]:
    """The check that a process is ``uid``'s (its ``/proc`` entry, links never followed)."""

    def check(pid: int) -> bool:
        return os.stat(f"/proc/{pid}", follow_symlinks=False).st_uid == uid

    return check
