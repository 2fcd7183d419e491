"""What path-traversal payloads would touch outside a workspace, to check they touched nothing."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path


def outside_targets(root: Path, paths: Iterable[str]) -> dict[str, tuple[int, int] | None]:
    """What each payload names outside the workspace if taken at face value: that path's size
    and mtime, or None where nothing is. (Symlinks inside the workspace lead only to the
    layout, which its snapshot covers.)"""
    states: dict[str, tuple[int, int] | None] = {}
    inside = str(root) + os.sep
    for path in paths:
        if "\x00" in path:
            continue
        target = os.path.normpath(os.path.join(root, path))
        if target == str(root) or target.startswith(inside):
            continue
        try:
            info = os.lstat(target)
        except OSError:
            states[target] = None
        else:
            states[target] = (info.st_size, info.st_mtime_ns)
    return states
