"""Finding commands by the marker in their environment, for when no PID namespace holds them:
the leftovers of one command when it ends, and the orphans of worker processes that died."""

from __future__ import annotations

import os
import time
from collections.abc import Callable

from worker.exceptions import HostRegistryError, SandboxError
from worker.sandbox.call_cgroup import sweep_groups
from worker.sandbox.config import MARKER_VARIABLE, REAP_BOUND_S, SandboxConfig
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.layers import plan_for
from worker.sandbox.pidfd_kill import kill_checked, kill_until_gone, processes
from worker.sandbox.uid_leftovers import sweep_idle_uids


def sweep_orphans(config: SandboxConfig) -> int:
    """Kill commands whose worker process died mid-call; returns how many were found.

    A command in a control group is found by its group, named after the worker process that
    made it (its id in the host's registry, alive while its lock is held): this also ends a
    command whose worker died before the command's parent-death signal was set. Only this
    fleet's are touched: another fleet's workers on the host sweep their own. Without groups or
    a PID namespace, a command's children outlive a worker process killed with SIGKILL (only the
    shell has the parent-death signal) and are found by their marker. A worker calls this when
    it starts a process, and its main process now and then.
    """
    try:
        return _sweep(config)
    except (HostRegistryError, OSError) as exc:
        # The registry or the fleet's key cannot be read now: nothing can be proved dead.
        raise SandboxError(f"cannot sweep: {exc}") from exc


def _sweep(config: SandboxConfig) -> int:
    plan = plan_for(config, os.geteuid())
    # Per-run uids without namespaces: whatever a run left (its worker died mid-call) is every
    # process of its uid while no call of it runs here.
    by_uid = sweep_idle_uids(config) if plan.per_run and not plan.namespaced else 0
    if plan.grouped:
        return by_uid + sweep_groups(plan.cgroups, HostRegistry(config.host_state), config.fleet())
    if plan.per_run:
        return by_uid
    if plan.sweep_uid is None:
        return 0
    prefix = f"{MARKER_VARIABLE}=".encode()
    orphans = 0
    # Only the marks of this fleet's worker processes that are provably dead (their lock in
    # the host's registry is free): another fleet's, or a live worker's, are left alone.
    with HostRegistry(config.host_state).dead_workers(config.fleet()) as dead:
        for pid in _processes_of(plan.sweep_uid):
            for entry in _environ(pid).split(b"\0"):
                if entry.startswith(prefix):
                    owner, _, _ = entry[len(prefix) :].partition(b"-")
                    if owner.decode(errors="replace") in dead:
                        kill_checked(pid, _carrying(entry + b"\0"))
                        orphans += 1
                    break
    return orphans


def sweep_marked(marker: str, uid: int) -> None:
    """Kill every live process of ``uid`` carrying ``marker``, those that left the session too.

    A killed process keeps its environment until it has exited, so the sweep ends when none
    is found: nothing of the command is running any more.
    """
    carries = _carrying(f"{MARKER_VARIABLE}={marker}\0".encode())
    kill_until_gone(
        lambda: [pid for pid in _processes_of(uid) if carries(pid)],
        carries,
        time.monotonic() + REAP_BOUND_S,
    )


def _processes_of(uid: int) -> list[int]:
    return [pid for pid, owner in processes() if owner == uid]


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read()
    except OSError:
        return b""


def _carrying(needle: bytes) -> Callable[[int], bool]:
    """The check that a process's environment holds ``needle``."""
    return lambda pid: needle in _environ(pid)
