"""Reading a batch's results file, while the batch may still be appending to it.

A reader can catch a line half written (the batch writes each line whole, but a read between
two parts of one write sees only the first), and a process killed mid-write leaves one behind.
A line is written once its newline is: anything after the last newline is not there yet.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def finished_text(path: Path) -> str:
    """What ``path`` holds up to its last newline ("" when it does not exist yet)."""
    if not path.exists():
        return ""
    data = path.read_bytes()
    return data[: data.rfind(b"\n") + 1].decode()


def finished_lines(path: Path) -> list[str]:
    """The complete lines of ``path``, without their newlines."""
    return finished_text(path).split("\n")[:-1]


def finished_records(path: Path) -> list[dict[str, Any]]:
    """The results written to ``path`` so far, each complete line as JSON."""
    return [json.loads(line) for line in finished_lines(path) if line.strip()]
