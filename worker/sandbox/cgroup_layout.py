"""Control groups this machine gives the worker: which hierarchies are mounted, where in each the
worker may make a group per call, and which job each of them does for calls, v2 first.

The jobs: ``kill`` (find every process of a call and kill them at once), ``cpu`` (account CPU
time), ``pids`` (the process limit), ``memory`` (the memory limit, by resident memory with swap
counted) and ``cpu-limit`` (the CPU bandwidth a run may ask, ``limits.cpu``). A v2 group always
kills and accounts CPU; it limits processes, memory and CPU only when those controllers are
enabled below the worker's group, which the worker arranges itself at the root of the hierarchy
or of a container's cgroup namespace. What v2 does not give, a v1 hierarchy of that controller
does (``freezer``, ``cpuacct``, ``pids``, ``memory``, ``cpu``). Call groups are made in the
worker's own group of each hierarchy, under ``toolq-sandbox``.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path

from worker.sandbox.config import CgroupMode

log = logging.getLogger(__name__)

#: The job that holds a run's CPU limit (CFS bandwidth: a quota of CPU time per period).
CPU_LIMIT = "cpu-limit"
JOBS = ("kill", "cpu", "pids", "memory", CPU_LIMIT)
#: The v1 controller that does each job.
V1_CONTROLLERS = {
    "kill": "freezer",
    "cpu": "cpuacct",
    "pids": "pids",
    "memory": "memory",
    CPU_LIMIT: "cpu",
}
#: The v2 controller a call group needs enabled for each job; killing and CPU accounting need none.
V2_CONTROLLERS = {"pids": "pids", "memory": "memory", CPU_LIMIT: "cpu"}
#: The folder of call groups in the worker's own group of each hierarchy.
PARENT_NAME = "toolq-sandbox"
#: Where a worker moves the processes of a cgroup namespace's root, so that it may enable
#: controllers for its call groups (v2 lets a group with processes have no controlled children).
WORKER_LEAF = "toolq-worker"


@dataclass(frozen=True, slots=True)
class Hierarchy:
    """One mounted hierarchy the worker makes call groups in, and the jobs they do there."""

    version: int
    #: The folder call groups are made in.
    parent: Path
    jobs: tuple[str, ...]
    #: v1 memory only: swap is accounted (``memory.memsw.*``), so the limit can count it.
    swap_accounted: bool = False

    @property
    def layer(self) -> str:
        return f"cgroup-v{self.version}({','.join(self.jobs)})"


@dataclass(frozen=True, slots=True)
class CgroupLayout:
    """The hierarchies call groups are made in, and why a job none of them does is missing."""

    hierarchies: tuple[Hierarchy, ...] = ()
    missing: tuple[tuple[str, str], ...] = ()

    def doing(self, job: str) -> Hierarchy | None:
        return next((h for h in self.hierarchies if job in h.jobs), None)

    @property
    def layers(self) -> tuple[str, ...]:
        return tuple(h.layer for h in self.hierarchies)

    def by(self, job: str) -> str | None:
        """Which cgroup version does ``job``, as ``cgroup v2``; None when none does."""
        hierarchy = self.doing(job)
        return None if hierarchy is None else f"cgroup v{hierarchy.version}"

    def why_not(self, job: str) -> str | None:
        """Why no hierarchy does ``job`` here; None when one does."""
        return dict(self.missing).get(job)


@dataclass(frozen=True, slots=True)
class _Mount:
    version: int
    point: Path
    #: The part of the hierarchy mounted there (``/`` unless a container mounted a subtree).
    root: str
    controllers: frozenset[str] = field(default_factory=frozenset)


def detect_layout(
    mode: CgroupMode,
    root: str,
    *,
    mountinfo: str | None = None,
    proc_cgroup: str | None = None,
) -> CgroupLayout:
    """The layout for ``mode`` on this machine: what each job is done by, made ready to use.

    ``mountinfo`` and ``proc_cgroup`` stand for ``/proc/self/mountinfo`` and
    ``/proc/self/cgroup`` (tests point them at a tree of their own under ``root``).
    """
    if mode == "off":
        off = "cgroups are switched off (TOOLQ_SANDBOX_CGROUP=off)"
        return CgroupLayout(missing=tuple((job, off) for job in JOBS))
    mountinfo = read_or_empty("/proc/self/mountinfo") if mountinfo is None else mountinfo
    proc_cgroup = read_or_empty("/proc/self/cgroup") if proc_cgroup is None else proc_cgroup
    found = _mounts(mountinfo, Path(root))
    v2_path, v1_paths = _own_groups(proc_cgroup)
    hierarchies: list[Hierarchy] = []
    why: dict[str, list[str]] = {job: [] for job in JOBS}
    if mode in ("auto", "v2"):
        v2 = next((m for m in found if m.version == 2), None)
        if v2 is None or v2_path is None:
            reasons = dict.fromkeys(JOBS, f"no cgroup v2 hierarchy under {root}")
        else:
            hierarchy, reasons = _prepare_v2(v2, v2_path, set(v1_paths))
            if hierarchy is not None:
                hierarchies.append(hierarchy)
        for job, reason in reasons.items():
            why[job].append(reason)
    if mode in ("auto", "v1"):
        done = {job for h in hierarchies for job in h.jobs}
        hierarchies += _prepare_v1(found, v1_paths, [j for j in JOBS if j not in done], why)
    if hierarchies and not any("kill" in h.jobs for h in hierarchies):
        # Any group lists its processes: they can be killed one by one, if not all at once.
        hierarchies[0] = replace(hierarchies[0], jobs=("kill", *hierarchies[0].jobs))
    done = {job for h in hierarchies for job in h.jobs}
    missing = tuple(
        (job, "; ".join(why[job]) or "no hierarchy does it") for job in JOBS if job not in done
    )
    return CgroupLayout(tuple(hierarchies), missing)


def _prepare_v2(
    mount: _Mount, own_path: str, held_by_v1: set[str]
) -> tuple[Hierarchy | None, dict[str, str]]:
    own = _own_dir(mount, own_path)
    if own is None:
        return None, dict.fromkeys(JOBS, "the worker's v2 group is outside the mounted part")
    if own.name == WORKER_LEAF:  # moved there by an earlier worker (see _enable_below)
        own = own.parent
    parent = own / PARENT_NAME
    failure = _make_parent(parent)
    if failure is not None:
        return None, dict.fromkeys(JOBS, failure)
    jobs = ["kill"]
    why: dict[str, str] = {}
    if (parent / "cpu.stat").exists():
        jobs.append("cpu")
    else:
        why["cpu"] = "this kernel's v2 groups have no cpu.stat"
    offered = set(read_or_empty(own / "cgroup.controllers").split())
    for job, controller in V2_CONTROLLERS.items():
        if controller not in offered:
            why[job] = f"the v2 hierarchy offers no {controller} controller here" + (
                " (a v1 hierarchy holds it)" if controller in held_by_v1 else ""
            )
            continue
        failure = _enable_below(own, controller, own_path) or _enable(parent, controller)
        if failure is None:
            jobs.append(job)
        else:
            why[job] = failure
    return Hierarchy(2, parent, tuple(jobs)), why


def _enable_below(own: Path, controller: str, own_path: str) -> str | None:
    """Enable ``controller`` for the children of the worker's own v2 group."""
    if controller in read_or_empty(own / "cgroup.subtree_control").split():
        return None
    failure = _enable(own, controller)
    if failure is None or "busy" not in failure:
        return failure
    # A group with processes of its own may not share controllers with its children. The root
    # of a container's cgroup namespace is the container's to arrange: its processes move to a
    # leaf. Anywhere else the group belongs to someone else (a systemd unit, a session).
    if own_path.rstrip("/") not in ("", f"/{WORKER_LEAF}"):
        return (
            f"the worker's v2 group {own_path} has processes, so it cannot enable {controller} "
            "for its children; run the worker in a delegated group of its own"
        )
    leaf = own / WORKER_LEAF
    try:
        leaf.mkdir(exist_ok=True)
        for pid in read_or_empty(own / "cgroup.procs").split():
            with contextlib.suppress(OSError):  # gone meanwhile, or a kernel thread
                (leaf / "cgroup.procs").write_text(pid)
    except OSError as exc:
        return f"cannot move the container's processes to {leaf}: {exc.strerror or exc}"
    log.info("moved the processes of %s to %s to enable %s for call groups", own, leaf, controller)
    return _enable(own, controller)


def _enable(group: Path, controller: str) -> str | None:
    try:
        (group / "cgroup.subtree_control").write_text(f"+{controller}")
    except OSError as exc:
        reason = "busy" if exc.errno == errno.EBUSY else (exc.strerror or str(exc))
        return f"cannot enable {controller} in {group}: {reason}"
    return None


def _prepare_v1(
    found: list[_Mount], own_paths: dict[str, str], jobs: list[str], why: dict[str, list[str]]
) -> list[Hierarchy]:
    by_mount: dict[Path, list[str]] = {}
    parents: dict[Path, Path] = {}
    for job in jobs:
        controller = V1_CONTROLLERS[job]
        mount = next((m for m in found if m.version == 1 and controller in m.controllers), None)
        own = None if mount is None else own_paths.get(controller)
        if mount is None or own is None:
            why[job].append(f"no cgroup v1 {controller} hierarchy is mounted")
            continue
        directory = _own_dir(mount, own)
        if directory is None:
            why[job].append(f"the worker's v1 {controller} group is outside the mounted part")
            continue
        parent = directory / PARENT_NAME
        failure = None if parent in parents.values() else _make_parent(parent)
        if failure is not None:
            why[job].append(failure)
            continue
        parents[mount.point] = parent
        by_mount.setdefault(mount.point, []).append(job)
    return [
        Hierarchy(
            1,
            parents[point],
            tuple(jobs),
            swap_accounted=(parents[point] / "memory.memsw.limit_in_bytes").exists(),
        )
        for point, jobs in by_mount.items()
    ]


def _make_parent(parent: Path) -> str | None:
    """Make the folder of call groups and prove a group can be made in it."""
    # Named like no call group, so that no sweep ever takes it for one.
    probe = parent / f"probe-{uuid.uuid4().hex[:8]}"
    try:
        parent.mkdir(exist_ok=True)
        probe.mkdir()
        probe.rmdir()
    except OSError as exc:
        return f"cannot make control groups in {parent.parent}: {exc.strerror or exc}"
    return None


def stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the command name, the state first; none when
    the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            return stat.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _mounts(mountinfo: str, under: Path) -> list[_Mount]:
    found: list[_Mount] = []
    for line in mountinfo.splitlines():
        left, _, right = line.partition(" - ")
        fields, tail = left.split(), right.split()
        if len(fields) < 5 or len(tail) < 3 or tail[0] not in ("cgroup", "cgroup2"):
            continue
        point = Path(fields[4].replace("\\040", " "))
        if point != under and under not in point.parents:
            continue
        if tail[0] == "cgroup2":
            found.append(_Mount(2, point, fields[3]))
        else:
            options = frozenset(tail[2].split(","))
            if not any(m.version == 1 and m.controllers == options for m in found):
                found.append(_Mount(1, point, fields[3], options))
    return found


def _own_groups(proc_cgroup: str) -> tuple[str | None, dict[str, str]]:
    """The worker's v2 group and its v1 group by controller, from /proc/self/cgroup."""
    v2: str | None = None
    v1: dict[str, str] = {}
    for line in proc_cgroup.splitlines():
        number, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if number == "0" and not controllers:
            v2 = path
        else:
            for controller in controllers.split(","):
                v1[controller] = path
    return v2, v1


def _own_dir(mount: _Mount, path: str) -> Path | None:
    root = mount.root.rstrip("/")
    if root and path != root and not path.startswith(root + "/"):
        return None
    return mount.point / path[len(root) :].lstrip("/")


def read_or_empty(path: str | Path) -> str:
    try:
        with open(path) as file:
            return file.read()
    except OSError:
        return ""
