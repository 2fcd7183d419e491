"""Processes of this machine known by more than their pid: the pid and the moment the process
started (``/proc/<pid>/stat``), so that a pid the kernel has since given to another process is
never taken for the one recorded."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field

from worker.plumbing.proc_stat import boot_id, start_time


class ProcessStamp(BaseModel):
    """One process: its pid and when it started."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    pid: int = Field(gt=0)
    started: int = Field(ge=0, description="Clock ticks after boot at which the process started.")


def stamp(pid: int) -> ProcessStamp | None:
    """The process ``pid`` is now; None when none runs (a zombie has ended: only its exit status
    is left for its parent)."""
    started = start_time(pid)
    return None if started is None else ProcessStamp(pid=pid, started=started)


def is_running(recorded: ProcessStamp) -> bool:
    """The recorded process still runs (its pid was not given to another since)."""
    return stamp(recorded.pid) == recorded


def descendants(pid: int) -> list[int]:
    """The children of ``pid``, their children, and so on, as they are now."""
    found: list[int] = []
    pending = [pid]
    while pending:
        parent = pending.pop()
        for task in Path(f"/proc/{parent}/task").glob("*"):
            with contextlib.suppress(OSError, ValueError):
                children = [int(child) for child in (task / "children").read_text().split()]
                found += children
                pending += children
    return found


def kill_all(recorded: list[ProcessStamp]) -> list[int]:
    """SIGKILL each recorded process that still runs, and every process below it; the pids
    killed. Those below are found first: once their parent dies they belong to another."""
    doomed = [
        found
        for process in recorded
        if is_running(process)
        for found in [process, *filter(None, map(stamp, descendants(process.pid)))]
    ]
    killed = []
    for process in doomed:
        if is_running(process):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(process.pid, signal.SIGKILL)
                killed.append(process.pid)
    return killed


def this_machine() -> str:
    """The machine a pid belongs to: its name and the boot of its kernel."""
    return f"{socket.gethostname()}/{boot_id() or 'unknown-boot'}"
