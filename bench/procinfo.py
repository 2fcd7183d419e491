"""Reading a process's CPU time, memory and threads from /proc."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of ``pid`` so far; 0 when it is gone."""
    return _stat_cpu(Path(f"/proc/{pid}/stat"))


def thread_cpu_seconds(pid: int, tid: int) -> float:
    """User plus system CPU time of one thread of ``pid`` (its main thread: ``tid == pid``)."""
    return _stat_cpu(Path(f"/proc/{pid}/task/{tid}/stat"))


def _stat_cpu(path: Path) -> float:
    try:
        stat = path.read_text()
    except OSError:
        return 0.0
    # The command name may hold spaces: the fields start after its closing parenthesis.
    fields = stat[stat.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _TICKS


def status_kb(pid: int, field: str) -> int:
    """A ``kB`` field of /proc/<pid>/status, e.g. VmRSS or VmHWM; 0 when unreadable."""
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{field}:"):
                return int(line.split()[1])
    return 0


def process_tree(pid: int) -> list[int]:
    """``pid`` and its children (a worker's pool processes), one level down."""
    children: list[int] = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                children += [int(p) for p in (task / "children").read_text().split()]
    return [pid, *children]
