"""Finding a launch's processes in /proc: unshare's child is the namespace's init, and the
init's first child in the namespace is the command."""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

#: The pid the first process a PID namespace's init starts always has inside it.
_FIRST_CHILD_IN_NAMESPACE = "2"


def children(pid: int) -> list[int]:
    """The children of ``pid`` (none when it is gone)."""
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/children") as listing:
                found += [int(child) for child in listing.read().split()]
    return found


def first_child_in_namespace(init_pid: int) -> int | None:
    """The child of the namespace's init that is the first process it started, or None."""
    for child in children(init_pid):
        with contextlib.suppress(OSError), open(f"/proc/{child}/status") as status:
            for line in status:
                if line.startswith("NSpid:"):
                    if line.split()[-1] == _FIRST_CHILD_IN_NAMESPACE:
                        return child
                    break
    return None


@dataclass(frozen=True, slots=True)
class ForkedCommand:
    """The call's command under a namespace's init, forked ahead (``Plan.forks_ahead``) or
    started as the call came: the init's pid, and the process's own pid and a pidfd to it."""

    init_pid: int
    pid: int
    pidfd: int


def find_forked(launched: int) -> ForkedCommand | None:
    """The command's process under the init that ``launched`` (unshare) started, or None
    (gone, or not found)."""
    init = next(iter(children(launched)), None)
    command = None if init is None else first_child_in_namespace(init)
    if init is None or command is None:
        return None
    try:
        return ForkedCommand(init, command, os.pidfd_open(command))
    except OSError:
        return None
