"""A box's control group, as the runtime made it from ``cgroupsPath``: what one call used, and
the call's leftovers killed (runc: the host sees the box's processes in its group).

Calls of a run take turns, so the group's figures between the start and the end of a call are
the call's: its CPU time, its memory peak (reset before it starts, on cgroup v1), whether the
memory limit killed one of its processes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path

from worker.sandbox.result import Usage

_V1 = ("freezer", "cpuacct", "memory", "pids")
_POLL_S = 0.005


class BoxGroup:
    """The box's group in each mounted hierarchy that has it."""

    def __init__(self, cgroup_root: Path, path: str) -> None:
        relative = path.lstrip("/")
        self.v1 = {c: cgroup_root / c / relative for c in _V1 if (cgroup_root / c).is_dir()}
        unified = cgroup_root / "unified" if (cgroup_root / "unified").is_dir() else cgroup_root
        self.v2 = unified / relative if (unified / "cgroup.controllers").exists() else None

    def remove(self) -> None:
        """Remove the group's folders (a runtime may leave them, empty, behind)."""
        for folder in (*self.v1.values(), self.v2):
            if folder is not None:
                with contextlib.suppress(OSError):
                    folder.rmdir()

    def members(self) -> set[int]:
        for folder in (*self.v1.values(), self.v2):
            if folder is not None and (folder / "cgroup.procs").exists():
                with contextlib.suppress(OSError):
                    text = (folder / "cgroup.procs").read_text()
                    return {int(line) for line in text.split()}
        return set()

    def begin_call(self) -> tuple[int | None, int]:
        """Reset the memory peak; the CPU time and OOM kills so far."""
        memory = self.v1.get("memory")
        if memory is not None:
            for name in ("memory.max_usage_in_bytes", "memory.memsw.max_usage_in_bytes"):
                with contextlib.suppress(OSError):
                    (memory / name).write_text("0")
        return self._cpu_ns(), self._oom_kills()

    def call_usage(self, before: tuple[int | None, int], killed: int) -> Usage:
        cpu_before, ooms_before = before
        cpu_now = self._cpu_ns()
        cpu_ms = None
        if cpu_before is not None and cpu_now is not None:
            cpu_ms = max(0, (cpu_now - cpu_before) // 1_000_000)
        return Usage(
            cpu_ms=cpu_ms,
            max_rss_kb=self._peak_kb(),
            pids_peak=self._pids_peak(),
            killed_processes=killed,
            oom_killed=self._oom_kills() > ooms_before,
        )

    def kill_all_but(
        self, keep: int, deadline: float, spared: Callable[[set[int]], set[int]]
    ) -> int:
        """SIGKILL every process of the box but ``keep`` (its init) and those ``spared`` says
        of its members, frozen first so that none forks meanwhile; how many there were."""

        def others_now() -> set[int]:
            members = self.members() - {keep}
            return members - spared(members) if members else members

        others = others_now()
        if not others:
            return 0
        frozen = self._freeze(True, deadline)
        try:
            others = others_now()
            for pid in others:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
        finally:
            if frozen:
                self._freeze(False, deadline)
        while time.monotonic() < deadline and self.members() & others:
            time.sleep(_POLL_S)
        return len(others)

    def _freeze(self, frozen: bool, deadline: float) -> bool:
        freezer = self.v1.get("freezer")
        if freezer is not None and (freezer / "freezer.state").exists():
            want = "FROZEN" if frozen else "THAWED"
            with contextlib.suppress(OSError):
                (freezer / "freezer.state").write_text(want)
                while time.monotonic() < deadline:
                    if (freezer / "freezer.state").read_text().strip() == want:
                        return True
                    time.sleep(_POLL_S)
            return False
        if self.v2 is not None and (self.v2 / "cgroup.freeze").exists():
            with contextlib.suppress(OSError):
                (self.v2 / "cgroup.freeze").write_text("1" if frozen else "0")
                return True
        return False

    def _cpu_ns(self) -> int | None:
        cpuacct = self.v1.get("cpuacct")
        with contextlib.suppress(OSError, ValueError):
            if cpuacct is not None:
                return int((cpuacct / "cpuacct.usage").read_text())
            if self.v2 is not None:
                stat = _keyed(self.v2 / "cpu.stat")
                return stat["usage_usec"] * 1000 if "usage_usec" in stat else None
        return None

    def _peak_kb(self) -> int | None:
        memory = self.v1.get("memory")
        with contextlib.suppress(OSError, ValueError):
            if memory is not None:
                return int((memory / "memory.max_usage_in_bytes").read_text()) // 1024
        return None

    def _pids_peak(self) -> int | None:
        if self.v2 is not None:
            with contextlib.suppress(OSError, ValueError):
                return int((self.v2 / "pids.peak").read_text())
        return None

    def _oom_kills(self) -> int:
        memory = self.v1.get("memory")
        with contextlib.suppress(OSError, ValueError):
            if memory is not None:
                return _keyed(memory / "memory.oom_control").get("oom_kill", 0)
            if self.v2 is not None:
                return _keyed(self.v2 / "memory.events").get("oom_kill", 0)
        return 0


def _keyed(path: Path) -> dict[str, int]:
    found = {}
    for line in path.read_text().splitlines():
        key, _, value = line.partition(" ")
        if value.strip().isdigit():
            found[key] = int(value)
    return found


def swap_accounted(cgroup_root: Path) -> bool:
    """Swap is counted with memory here (cgroup v1's memsw, or cgroup v2), so a limit can
    hold both."""
    if (cgroup_root / "memory").is_dir():
        return (cgroup_root / "memory" / "memory.memsw.limit_in_bytes").exists()
    return (cgroup_root / "cgroup.controllers").exists()
