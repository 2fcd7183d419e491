"""A result line in brief: what a table of a batch's results shows, sorts and filters on.

A summary keeps a line's scalars and its answer, not its messages or tool outputs, so that a
hundred thousand of them fit in memory and the whole table can be filtered at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class ItemSummary:
    """One result line: its outcome, its cost, and its answer (or why it failed)."""

    id: str
    status: str
    stop_reason: str | None = None
    #: The score's verdict: True passed, False failed, None when the item was not scored.
    passed: bool | None = None
    duration_s: float | None = None
    tokens: int | None = None
    tool_calls: int = 0
    tool_errors: int = 0
    answer: str | None = None
    error: str | None = None

    @classmethod
    def of(cls, record: Mapping[str, Any]) -> ItemSummary:
        """The summary of an output record; fields it lacks or has in another shape are None."""
        calls = record.get("tool_calls")
        calls = calls if isinstance(calls, list) else []
        usage = record.get("usage")
        score = record.get("score")
        return cls(
            id=str(record.get("id", "")),
            status=str(record.get("status") or "unknown"),
            stop_reason=as_text(record.get("stop_reason")),
            passed=_passed(score),
            duration_s=as_number(record.get("duration_s")),
            tokens=as_integer(usage.get("total_tokens")) if isinstance(usage, dict) else None,
            tool_calls=len(calls),
            tool_errors=sum(1 for call in calls if isinstance(call, dict) and call.get("is_error")),
            answer=as_text(record.get("answer")),
            error=as_text(record.get("error")),
        )

    @classmethod
    def unreadable(cls, where: str, reason: str) -> ItemSummary:
        """A line that is not a result record: kept in the table, so nothing is lost."""
        return cls(id=where, status="unreadable", error=reason)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ItemSummary:
        return cls(**json.loads(raw))

    @property
    def searchable(self) -> str:
        """What a text search looks in: the id, the answer and the error, case-folded."""
        return "\n".join(filter(None, (self.id, self.answer, self.error))).casefold()


def _passed(score: object) -> bool | None:
    if isinstance(score, dict) and isinstance(score.get("passed"), bool):
        return bool(score["passed"])
    return None


def as_text(value: object) -> str | None:
    """``value`` if it is a string, else None: a record read from a file may hold anything."""
    return value if isinstance(value, str) else None


def as_number(value: object) -> float | None:
    """``value`` as a float if it is a number (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)


def as_integer(value: object) -> int | None:
    """``value`` if it is an integer (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int):
        return None
    return value
