"""``toolq prune``: the workers' own program (``python -m worker.prune``) run on this host,
after the age given is read here, so a bad one is refused as the CLI's other options are."""

from __future__ import annotations

import re
import subprocess
import sys

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


def run_prune(older_than: str | None, dry_run: bool) -> int:
    """Run the workers' prune on this host's TOOLQ_WORKSPACE_ROOT; its exit code."""
    argv = [sys.executable, "-m", "worker.prune"]
    if older_than is not None:
        argv += ["--older-than-s", repr(parse_duration(older_than))]
    if dry_run:
        argv.append("--dry-run")
    return subprocess.run(argv, check=False).returncode
