"""Remove run workspaces no call has touched for a while, by hand: what ``toolq prune`` runs.

It runs as a program of its own (``python -m worker.prune``) on the host whose workspaces it
removes, as the workers do: the orchestrator's CLI starts it rather than importing the workers'
floor.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.table import Table

from worker.contract.settings import WorkerSettings
from worker.quota import WorkspaceQuota
from worker.retention import empty_trash, prune


def run_prune(
    settings: WorkerSettings, older_than_s: float | None, dry_run: bool, console: Console
) -> int:
    """Remove (or, dry, list) the workspaces under TOOLQ_WORKSPACE_ROOT idle for longer than
    ``older_than_s`` seconds (default TOOLQ_WORKSPACE_TTL_S); those with a call in flight stay."""
    seconds = settings.workspace_ttl_s if older_than_s is None else older_than_s
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
    table = Table()
    # A run's id is what a user greps for: never cut, whatever the width.
    table.add_column("run", no_wrap=True, overflow="fold")
    for heading in ("idle", "size", "done"):
        table.add_column(heading)
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m worker.prune", description=__doc__)
    parser.add_argument("--older-than-s", type=float, default=None, help="idle for this long")
    parser.add_argument("--dry-run", action="store_true", help="list, remove nothing")
    args = parser.parse_args(argv)
    return run_prune(WorkerSettings(), args.older_than_s, args.dry_run, Console(highlight=False))


if __name__ == "__main__":
    raise SystemExit(main())
