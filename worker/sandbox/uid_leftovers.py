"""What a run leaves behind where no namespace collects it: with per-run uids and no mount or
PID namespace (``TOOLQ_SANDBOX_ISOLATION=process``), the last call of a run to end on this host
kills every process of the run's uid. What the uid left at the top of /tmp, /var/tmp and /dev/shm
stays for the run's next call and goes with its workspace (``identity.release``).

Every process of the uid is the run's: whatever it did to its environment, session or parent
(``env -u``, ``setsid``, a double fork), it cannot change its uid. Calls of one run can overlap
(a model's parallel tool calls): each holds a shared lock on the uid's lock file while it runs,
and only a call that gets the exclusive lock at its end, so no other call of the run is running,
sweeps. A worker process that died mid-call leaves its run's processes to the next sweep
(``sweep_idle_uids``), which takes the same lock. The locks are in the host's registry
(``host_registry``), so every worker on the host sees them whatever its fleet, and the sweep
touches only the uids the registry says this fleet holds here: another fleet's commands and
containers, and uids nobody claims, are left alone. A run's image container (its box, in a
control group under ``/toolq-images`` that no command can join) outlives its calls by design
and is ended by the sweep of boxes, never by this one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator

from worker.plumbing.proc_stat import process_alive
from worker.sandbox.config import REAP_BOUND_S, SandboxConfig
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.pidfd_kill import kill_until_gone, owned_by, processes
from worker.sandbox.plan import Plan

#: Where the runtime puts the control groups of runs' image containers.
BOX_GROUPS = "/toolq-images/"


@contextlib.contextmanager
def run_guard(call_plan: Plan, config: SandboxConfig) -> Iterator[None]:
    """Around one call of ``call_plan``: with per-run uids and no namespace, the sweep of its
    uid once the last call of its run here ends. Nothing to do otherwise."""
    if not call_plan.per_run or call_plan.namespaced or call_plan.drop_to is None:
        yield
        return
    uid = call_plan.drop_to[0]
    fd = HostRegistry(config.host_state).uid_lock(uid)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        yield
    finally:
        _sweep_if_idle(fd, uid)


def sweep_idle_uids(config: SandboxConfig) -> int:
    """Sweep every uid of the range that this fleet holds on this host and that has processes
    but no call running (its worker process died mid-call); returns how many processes were
    killed."""
    if config.uid_range is None:
        return 0
    registry, fleet = HostRegistry(config.host_state), config.fleet()
    found: set[int] = set()
    for pid, uid in processes():
        if uid in config.uid_range and _sweepable(pid):
            found.add(uid)
    killed = 0
    for uid in found:
        holder = registry.uid_holder(uid)
        if holder is None or holder.fleet != fleet:
            continue  # another fleet's, or nobody's: nothing proves it this fleet's to end
        killed += _sweep_if_idle(registry.uid_lock(uid), uid)
    return killed


def _sweep_if_idle(fd: int, uid: int) -> int:
    """Sweep ``uid`` if no call of its run holds its lock (``fd``, closed here); returns how
    many processes were killed."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return 0  # another call of the run is running: the last one sweeps
    else:
        return sweep_uid(uid)
    finally:
        os.close(fd)


def sweep_uid(uid: int) -> int:
    """Kill every process of ``uid`` until none is left (within ``REAP_BOUND_S``); returns how
    many processes were killed. What it left in /tmp stays for the run's next call, and goes
    with its workspace (``identity.release``)."""
    return kill_until_gone(
        lambda: [pid for pid, owner in processes() if owner == uid and _sweepable(pid)],
        owned_by(uid),
        time.monotonic() + REAP_BOUND_S,
    )


def _sweepable(pid: int) -> bool:
    """Not already dead (a zombie waits for its parent, and no signal ends it) and not in a box."""
    return process_alive(pid) and not _in_a_box(pid)


def _in_a_box(pid: int) -> bool:
    """Whether ``pid`` is a process of a run's image container: in a box's control group
    (``worker.images.boxes.group_path``), which only root can move a process into."""
    try:
        with open(f"/proc/{pid}/cgroup") as groups:
            lines = groups.read().splitlines()
    except OSError:
        return False
    return any(line.split(":", 2)[-1].startswith(BOX_GROUPS) for line in lines)
