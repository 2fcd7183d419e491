"""What a worker's main process does besides serving calls: say which limits it applies (in its
heartbeat), end the commands of worker processes that died, and remove expired workspaces."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from worker.contract.settings import WorkerSettings
from worker.contract.wire import PER_PROCESS_MEMORY, SandboxLimits, WorkerLimits
from worker.images.pinning import sweep_now as sweep_boxes_now
from worker.quota import WorkspaceQuota
from worker.retention import empty_trash, prune
from worker.sandbox import SandboxConfig, SandboxError, sweep_orphans
from worker.sandbox.cgroup_layout import CPU_LIMIT
from worker.sandbox.layers import plan_for
from worker.sessions.holders import sweep_sessions

log = logging.getLogger(__name__)
#: How often the commands of dead worker processes are looked for. A worker process that dies
#: is replaced at once and its replacement sweeps when it starts; this catches the rest.
SWEEP_INTERVAL_S = 30.0
#: Expired workspaces are looked for this often, or more often for short lifetimes.
LONGEST_PRUNE_INTERVAL_S = 3600.0


def worker_limits(settings: WorkerSettings, pools: Iterable[str]) -> WorkerLimits:
    """The limits a worker serving ``pools`` applies, as its heartbeat publishes them."""
    quota = settings.workspace_quota_bytes
    config = SandboxConfig.from_settings(settings)
    by = "none"
    if quota:
        by = (
            "a file system per run" if config.volume_bytes and config.per_run_uids else "accounting"
        )
    return WorkerLimits(
        workspace_quota_bytes=quota,
        workspace_quota_by=by,
        workspace_ttl_s=settings.workspace_ttl_s,
        sandbox=sandbox_limits(config) if "sandbox" in pools else None,
    )


def sandbox_limits(config: SandboxConfig) -> SandboxLimits:
    """Which limits hold for run_bash here, and what enforces each."""
    base = {
        "memory_mb": config.settings.memory_mb,
        "max_processes": config.settings.max_processes,
        "file_size_mb": config.settings.file_size_mb,
        "cpu": config.settings.cpu,
    }
    try:
        plan = plan_for(config, os.geteuid())
    except SandboxError as exc:
        return SandboxLimits(
            isolation=[],
            memory_by="none",
            processes_by="none",
            cpu_accounting_by="none",
            problem=str(exc),
            **base,
        )
    groups = plan.cgroups
    rlimited = bool(plan.prlimit)
    return SandboxLimits(
        isolation=list(plan.layers),
        memory_by=groups.by("memory") or (PER_PROCESS_MEMORY if rlimited else "none"),
        processes_by=groups.by("pids") or ("rlimit (per user)" if rlimited else "none"),
        cpu_accounting_by=groups.by("cpu") or "rusage (the processes the command waited for)",
        cpu_limit_by=groups.by(CPU_LIMIT) or f"none: {groups.why_not(CPU_LIMIT)}",
        **base,
    )


class Housekeeping:
    """A thread of the worker's main process: sweeps orphaned commands (sandbox workers) and
    removes workspaces no call touched for ``TOOLQ_WORKSPACE_TTL_S``."""

    def __init__(self, settings: WorkerSettings, pools: Iterable[str]) -> None:
        self._settings = settings
        self._sandbox = "sandbox" in pools
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolq-housekeeping", daemon=True)
        self._prune_every = min(LONGEST_PRUNE_INTERVAL_S, max(1.0, settings.workspace_ttl_s / 4))

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def prune_now(self) -> None:
        root = Path(self._settings.workspace_root)
        quota = WorkspaceQuota(root, self._settings.workspace_quota_bytes)
        empty_trash(root)
        ttl = self._settings.workspace_ttl_s
        removed = [e for e in prune(root, ttl, quota=quota) if e.removed]
        if removed:
            log.info("removed %d workspace(s) no call touched for %d s", len(removed), ttl)

    def sweep_now(self) -> None:
        found = sweep_orphans(SandboxConfig.from_settings(self._settings))
        if found:
            log.warning("ended %d command(s) of worker processes that died", found)
        # And the containers of runs that are over, or of sandbox workers that died.
        sweep_boxes_now()
        # And what sessions lost with their workers left, once their runs are over.
        forgotten = sweep_sessions(SandboxConfig.from_settings(self._settings))
        if forgotten:
            log.info("forgot %d shell session(s) of runs that are over", forgotten)

    def _run(self) -> None:
        next_sweep = next_prune = time.monotonic()
        while not self._stop.is_set():
            now = time.monotonic()
            if self._sandbox and now >= next_sweep:
                self._chore(self.sweep_now)
                next_sweep = now + SWEEP_INTERVAL_S
            if now >= next_prune:
                self._chore(self.prune_now)
                next_prune = now + self._prune_every
            wake = min(next_prune, next_sweep) if self._sandbox else next_prune
            self._stop.wait(max(0.0, wake - time.monotonic()))

    @staticmethod
    def _chore(chore: Callable[[], None]) -> None:
        try:
            chore()
        except (OSError, SandboxError) as exc:
            log.warning("housekeeping (%s) failed: %s", chore.__name__, exc)
        except Exception:
            # A fault in one round must not end the thread: the next round may succeed, and a
            # dead thread would never prune or sweep again while the worker serves on.
            log.exception("housekeeping (%s) failed", chore.__name__)
