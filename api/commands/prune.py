"""``toolq prune``: remove run workspaces no call has touched for a while, by hand."""

from __future__ import annotations

import re
from pathlib import Path

from rich.console import Console
from rich.table import Table

from worker.quota import WorkspaceQuota
from worker.retention import empty_trash, prune
from worker.settings import WorkerSettings

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86_400, "w": 604_800}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")


def parse_duration(text: str) -> float:
    """Seconds in ``90``, ``90s``, ``30m``, ``12h``, ``7d`` or ``2w``; ValueError otherwise."""
    found = _DURATION.match(text.lower())
    if found is None:
        raise ValueError(
            f"{text!r} is not a duration: give a number of seconds, or one with a unit "
            "(s, m, h, d, w), such as 30m or 7d"
        )
    return float(found.group(1)) * _UNITS[found.group(2) or "s"]


def run_prune(
    settings: WorkerSettings, older_than: str | None, dry_run: bool, console: Console
) -> int:
    """Remove (or, dry, list) the workspaces under TOOLQ_WORKSPACE_ROOT idle for longer than
    ``older_than`` (default TOOLQ_WORKSPACE_TTL_S); those with a call in flight stay."""
    seconds = settings.workspace_ttl_s if older_than is None else parse_duration(older_than)
    root = Path(settings.workspace_root)
    if not root.exists():  # the workers make it with the first run's workspace
        console.print(f"No workspace to remove: {root} does not exist yet.", markup=False)
        return 0
    quota = WorkspaceQuota(root, settings.workspace_quota_bytes)
    if not dry_run:
        empty_trash(root)
    expired = prune(root, seconds, dry_run=dry_run, sizes=True, quota=quota)
    verb = "would remove" if dry_run else "removed"
    if not expired:
        console.print(f"No workspace under {root} has been idle for {seconds:,.0f} s or more.")
        return 0
    table = Table("run", "idle", "size", "done")
    for entry in expired:
        done = verb if entry.removed or dry_run else f"kept: {entry.skipped}"
        size = "?" if entry.size_bytes is None else f"{entry.size_bytes / 2**20:,.1f} MiB"
        table.add_row(entry.run_id, _idle(entry.idle_s), size, done)
    console.print(table)
    count = sum(1 for e in expired if e.removed or dry_run)
    console.print(f"{verb} {count} of {len(expired)} idle workspace(s) under {root}")
    return 0


def _idle(seconds: float) -> str:
    for unit, size in (("d", 86_400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.0f} s"
