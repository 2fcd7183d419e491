"""What path-traversal payloads would touch outside a workspace, to check they touched nothing."""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: A NUL byte in the path of every tool that takes one.
NUL_PATH_CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("read_file", {"path": "a\x00b"}),
    ("write_file", {"path": "a\x00b", "content": "x"}),
    ("list_dir", {"path": "a\x00b"}),
    ("mkdir", {"path": "a\x00b"}),
    ("remove", {"path": "a\x00b"}),
    ("move", {"source": "a\x00b", "destination": "c"}),
    ("move", {"source": "c", "destination": "a\x00b"}),
    ("search_files", {"pattern": "*", "path": "a\x00b"}),
)


def calls_naming(name: str) -> tuple[tuple[str, dict[str, Any]], ...]:
    """A call of each tool that makes, reads, lists or moves a path, on ``name``."""
    return (
        ("write_file", {"path": name, "content": "x"}),
        ("read_file", {"path": name}),
        ("mkdir", {"path": f"{name}/sub"}),
        ("list_dir", {"path": name}),
        ("move", {"source": name, "destination": "x"}),
    )


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
