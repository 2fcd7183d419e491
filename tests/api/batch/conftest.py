"""What the batch tests share: input files written line by line, and output records."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any


def write_lines(path: Path, lines: Sequence[str | dict[str, Any]]) -> Path:
    text = "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    path.write_text(text)
    return path


def record(item_id: str, status: str = "ok", **extra: Any) -> dict[str, Any]:
    return {"id": item_id, "status": status, "answer": "ü", **extra}
