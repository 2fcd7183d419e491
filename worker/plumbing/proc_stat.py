"""What ``/proc`` says of a process of this machine: whether it runs, and when it started (with
the kernel's boot, what tells it apart from a later process given the same pid).

Both floors read it: the orchestrator for its local stack's processes and ``toolq wait
--pid``, the workers for the holders of containers and shell sessions.
"""

from __future__ import annotations

from pathlib import Path

_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")
#: Where the start time is among the fields that follow the command name in /proc/<pid>/stat
#: (field 22 of proc(5), counted from the state, field 3).
_STARTED_FIELD = 22 - 3
#: Where the parent's pid is (field 4 of proc(5)).
_PARENT_FIELD = 4 - 3
#: Where the session id is (field 6 of proc(5)).
_SESSION_FIELD = 6 - 3


def process_alive(pid: int) -> bool:
    """``pid`` runs (a zombie, which no reaper has collected yet, does not)."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] not in ("Z", "X")


def start_time(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); None when it does not run (a zombie has
    ended: only its exit status is left for its parent)."""
    fields = _running_fields(pid, _STARTED_FIELD)
    return None if fields is None else int(fields[_STARTED_FIELD])


def session_and_parent(pid: int) -> tuple[int, int] | None:
    """The session ``pid`` is in (its leader's pid) and its parent's pid (0 for one outside
    this /proc's namespace), from one read of its stat; None when it does not run."""
    fields = _running_fields(pid, max(_SESSION_FIELD, _PARENT_FIELD))
    if fields is None:
        return None
    return int(fields[_SESSION_FIELD]), int(fields[_PARENT_FIELD])


def boot_id() -> str:
    """This boot of the kernel ("" where /proc does not say)."""
    try:
        return _BOOT_ID.read_text().strip()
    except OSError:
        return ""


def _running_fields(pid: int, last: int) -> list[str] | None:
    """``_stat_fields`` of a process that runs (not a zombie), up to ``last`` at least."""
    fields = _stat_fields(pid)
    if fields is None or fields[0] in ("Z", "X") or len(fields) <= last:
        return None
    return fields


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat from its third field (the state) on; None without such a process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name may hold spaces and parentheses: fields count from the last ")".
    return stat[stat.rfind(")") + 2 :].split()
