"""One call's control groups: made with its limits before the command starts, the way to find,
count and kill every process of the command, what the command used, and gone once it is over.

A group is named after the worker process that made it: its id in the host's registry
(``host_registry``), whose lock the process holds for its whole life. ``sweep_groups`` can then
tell the groups of a worker process of its own fleet that died, whose commands nobody will end,
from those of a live one, whatever PID namespace either is in; a group it cannot tell that of
(another fleet's, or named otherwise) it leaves alone.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import signal
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from worker.exceptions import SandboxError
from worker.sandbox.bounded import poll_until
from worker.sandbox.cgroup_layout import CPU_LIMIT, CgroupLayout, Hierarchy, read_or_empty
from worker.sandbox.config import REAP_BOUND_S
from worker.sandbox.host_registry import WORKER_ID_LENGTH, HostRegistry

_CALL_ID_LENGTH = 12
#: The period of a CPU limit, the kernel's default: a command over its share waits at most
#: this long for more.
CPU_PERIOD_US = 100_000
#: The least quota the kernel takes.
_LEAST_QUOTA_US = 1_000
#: ``<worker id>-<call id>``: the name of every call group.
_NAME = re.compile(rf"([0-9a-f]{{{WORKER_ID_LENGTH}}})-[0-9a-f]{{{_CALL_ID_LENGTH}}}")


@dataclass(frozen=True, slots=True)
class GroupUsage:
    """What the processes of one group used, as the kernel counted it; None where no hierarchy
    of this machine counts it."""

    cpu_ms: int | None
    max_rss_kb: int | None
    pids_peak: int | None
    oom_killed: bool
    #: The CPUs the group's processes were held to; None: no CPU limit.
    cpu_limit: float | None = None


class CallGroup:
    """The group of one call in each hierarchy of a layout (all with the same name)."""

    def __init__(
        self, layout: CgroupLayout, name: str, hierarchies: tuple[Hierarchy, ...] | None = None
    ) -> None:
        self.name = name
        self.layout = layout
        chosen = layout.hierarchies if hierarchies is None else hierarchies
        self.dirs = {h: h.parent / name for h in chosen}
        #: The CPUs the group holds its processes to (``create``); None: no CPU limit.
        self.cpu_limit: float | None = None
        killer = layout.doing("kill")
        assert killer is not None, "a layout with hierarchies always has one that kills"
        self._killer = killer
        self._kill_dir = self.dirs[killer]

    @classmethod
    def create(
        cls,
        layout: CgroupLayout,
        *,
        worker: str,
        max_processes: int,
        memory_bytes: int,
        cpu: float | None = None,
    ) -> CallGroup:
        """A new group in every hierarchy of ``layout``, with the limits it does, named after
        ``worker`` (this process's id in the host's registry). ``cpu``: the CPUs its processes
        may use together; None: no CPU limit, and no group in a hierarchy that only limits CPU
        (a v1 ``cpu`` one), which would cost each call a group for nothing."""
        needed = tuple(h for h in layout.hierarchies if cpu is not None or h.jobs != (CPU_LIMIT,))
        group = cls(layout, f"{worker}-{uuid.uuid4().hex[:_CALL_ID_LENGTH]}", needed)
        made: list[Path] = []
        try:
            for hierarchy, directory in group.dirs.items():
                directory.mkdir()
                made.append(directory)
                _set_limits(hierarchy, directory, max_processes, memory_bytes)
                if cpu is not None and CPU_LIMIT in hierarchy.jobs:
                    _set_cpu_limit(hierarchy, directory, cpu)
                    group.cpu_limit = cpu
        except OSError as exc:
            for directory in reversed(made):
                with contextlib.suppress(OSError):
                    directory.rmdir()
            raise SandboxError(
                f"cannot make the command's control group in {exc.filename or made[-1:]}: "
                f"{exc.strerror or exc}"
            ) from exc
        return group

    @property
    def join_files(self) -> list[str]:
        """The files a process writes ``0`` to, to join the group in every hierarchy."""
        return [str(directory / "cgroup.procs") for directory in self.dirs.values()]

    def members(self) -> list[int]:
        return [int(pid) for pid in read_or_empty(self._kill_dir / "cgroup.procs").split()]

    def kill(self, deadline: float) -> list[int]:
        """Kill every process in the group at once; returns the pids that were in it."""
        directory = self._kill_dir
        if self._killer.version == 2 and (directory / "cgroup.kill").exists():
            # Atomic: a process forking meanwhile takes its child with it.
            members = self.members()
            if members:
                (directory / "cgroup.kill").write_text("1")
            return members
        # Frozen, the processes cannot fork while they are listed and killed.
        frozen = self._freeze(deadline)
        try:
            killed: set[int] = set()
            while True:
                members = [pid for pid in self.members() if pid not in killed]
                if not members or time.monotonic() > deadline:
                    return sorted(killed)
                for pid in members:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGKILL)
                killed.update(members)
                if frozen:
                    return sorted(killed)
        finally:
            if frozen:
                self._thaw()

    def wait_empty(self, deadline: float) -> bool:
        """Wait until no process is left in the group; False if some still are at ``deadline``."""
        return poll_until(lambda: not self.members(), deadline)

    def usage(self) -> GroupUsage:
        cpu = self.layout.doing("cpu")
        memory = self.layout.doing("memory")
        pids = self.layout.doing("pids")
        return GroupUsage(
            cpu_ms=None if cpu is None else _cpu_ms(cpu, self.dirs[cpu]),
            max_rss_kb=None if memory is None else _peak_kb(memory, self.dirs[memory]),
            pids_peak=None if pids is None else _number(self.dirs[pids] / "pids.peak"),
            oom_killed=memory is not None and _oom_kills(memory, self.dirs[memory]) > 0,
            cpu_limit=self.cpu_limit,
        )

    def remove(self, deadline: float | None = None) -> bool:
        """Kill what is left and remove the group everywhere; False if some part stays."""
        deadline = time.monotonic() + REAP_BOUND_S if deadline is None else deadline
        left = list(self.dirs.values())

        def removed() -> bool:
            for directory in list(left):
                try:
                    directory.rmdir()
                except FileNotFoundError:
                    pass
                except OSError as exc:
                    if exc.errno != errno.EBUSY:
                        raise
                    continue
                left.remove(directory)
            if left:
                # Busy: a process joined after the group was emptied (a spawn the worker's
                # death interrupted). It is killed like the rest.
                self.kill(deadline)
            return not left

        try:
            return poll_until(removed, deadline)
        except OSError:
            return False

    def _freeze(self, deadline: float) -> bool:
        directory = self._kill_dir
        if self._killer.version == 2 and (directory / "cgroup.freeze").exists():
            state, value, frozen = directory / "cgroup.events", "1", "frozen 1"
            control = directory / "cgroup.freeze"
        elif self._killer.version == 1 and (directory / "freezer.state").exists():
            state, value, frozen = directory / "freezer.state", "FROZEN", "FROZEN"
            control = state
        else:
            return False
        try:
            control.write_text(value)
        except OSError:
            return False
        return poll_until(lambda: frozen in read_or_empty(state).split("\n"), deadline)

    def _thaw(self) -> None:
        directory = self._kill_dir
        with contextlib.suppress(OSError):
            if self._killer.version == 2:
                (directory / "cgroup.freeze").write_text("0")
            else:
                (directory / "freezer.state").write_text("THAWED")


def sweep_groups(layout: CgroupLayout, registry: HostRegistry, fleet: str) -> int:
    """Kill the commands of ``fleet``'s worker processes that died and remove their groups;
    how many groups were found."""
    with registry.dead_workers(fleet) as dead:
        names: set[str] = set()
        for hierarchy in layout.hierarchies:
            with contextlib.suppress(OSError), os.scandir(hierarchy.parent) as entries:
                names.update(e.name for e in entries if e.is_dir() and _worker_of(e.name) in dead)
        for name in names:
            group = CallGroup(layout, name)
            deadline = time.monotonic() + REAP_BOUND_S
            group.kill(deadline)
            if not group.remove(deadline):
                dead.discard(_worker_of(name) or "")  # its lock stays, for the next sweep
        return len(names)


def _worker_of(name: str) -> str | None:
    """The worker id a call group's name holds; None for any other folder."""
    match = _NAME.fullmatch(name)
    return None if match is None else match.group(1)


def _set_limits(hierarchy: Hierarchy, directory: Path, processes: int, memory: int) -> None:
    if "pids" in hierarchy.jobs:
        (directory / "pids.max").write_text(str(processes))
    if "memory" not in hierarchy.jobs:
        return
    if hierarchy.version == 2:
        (directory / "memory.max").write_text(str(memory))
        swap = directory / "memory.swap.max"
        if swap.exists():  # no swap at all: resident memory is all a command may have
            swap.write_text("0")
    else:
        (directory / "memory.limit_in_bytes").write_text(str(memory))
        if hierarchy.swap_accounted:  # memory and swap together, set after memory alone
            (directory / "memory.memsw.limit_in_bytes").write_text(str(memory))


def _set_cpu_limit(hierarchy: Hierarchy, directory: Path, cpu: float) -> None:
    """At most ``cpu`` CPUs' time per period for the group's processes together (the kernel's
    CFS bandwidth control: past its quota the group waits for the next period)."""
    quota = cpu_quota_us(cpu)
    if hierarchy.version == 2:
        (directory / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
    else:
        (directory / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
        (directory / "cpu.cfs_quota_us").write_text(str(quota))


def cpu_quota_us(cpu: float) -> int:
    """The CPU time per ``CPU_PERIOD_US`` that ``cpu`` CPUs are, at least the kernel's least."""
    return max(_LEAST_QUOTA_US, round(cpu * CPU_PERIOD_US))


def _cpu_ms(hierarchy: Hierarchy, directory: Path) -> int | None:
    if hierarchy.version == 2:
        for line in read_or_empty(directory / "cpu.stat").splitlines():
            name, _, value = line.partition(" ")
            if name == "usage_usec" and value.strip().isdigit():
                return round(int(value) / 1000)
        return None
    nanoseconds = _number(directory / "cpuacct.usage")
    return None if nanoseconds is None else round(nanoseconds / 1_000_000)


def _peak_kb(hierarchy: Hierarchy, directory: Path) -> int | None:
    name = "memory.peak" if hierarchy.version == 2 else "memory.max_usage_in_bytes"
    peak = _number(directory / name)
    return None if peak is None else peak // 1024


def _oom_kills(hierarchy: Hierarchy, directory: Path) -> int:
    name = "memory.events" if hierarchy.version == 2 else "memory.oom_control"
    for line in read_or_empty(directory / name).splitlines():
        key, _, value = line.partition(" ")
        if key == "oom_kill" and value.strip().isdigit():
            return int(value)
    return 0


def _number(path: Path) -> int | None:
    text = read_or_empty(path).strip()
    return int(text) if text.isdigit() else None
