"""A result line in brief: what a table of a batch's results shows, sorts and filters on.

A summary keeps a line's scalars and its answer, not its messages or tool outputs, so that a
hundred thousand of them fit in memory and the whole table can be filtered at once.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

from api.batch.record import BatchRecord
from api.exceptions import NotABatchRecord

#: The status of a line that is not a result: the table keeps it, so that nothing is lost.
UNREADABLE = "unreadable"


@dataclass(frozen=True, slots=True)
class ItemSummary:
    """One result line: its outcome, its cost, and its answer (or why it failed)."""

    id: str
    #: The line's (``BatchRecord.status``), or ``UNREADABLE``.
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
    #: The run's image as the item named it, and the digest it ran; None without one.
    image: str | None = None
    image_digest: str | None = None

    @classmethod
    def of(cls, line: BatchRecord | Mapping[str, Any]) -> ItemSummary:
        """The summary of a result line, read or as its JSON object (``NotABatchRecord`` for an
        object without an id)."""
        record = line if isinstance(line, BatchRecord) else BatchRecord.read(line)
        image = record.image or {}
        return cls(
            id=record.id,
            status=record.status,
            stop_reason=record.stop_reason,
            passed=record.passed,
            duration_s=record.duration_s,
            tokens=record.tokens,
            tool_calls=len(record.tool_calls),
            tool_errors=record.tool_errors,
            answer=record.answer,
            error=record.error,
            image=as_text(image.get("reference")),
            image_digest=as_text(image.get("digest")),
        )

    @classmethod
    def read(cls, line: Mapping[str, Any], where: str) -> ItemSummary:
        """The summary of a JSON object read at ``where``, which may not be a result."""
        try:
            return cls.of(line)
        except NotABatchRecord as exc:
            return cls.unreadable(where, str(exc))

    @classmethod
    def unreadable(cls, where: str, reason: str) -> ItemSummary:
        """A line that is not a result record: kept in the table, so nothing is lost."""
        return cls(id=where, status=UNREADABLE, error=reason)

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> ItemSummary:
        return cls(**json.loads(raw))

    @property
    def searchable(self) -> str:
        """What a text search looks in: the id, the answer and the error, case-folded."""
        return "\n".join(filter(None, (self.id, self.answer, self.error))).casefold()


def as_text(value: object) -> str | None:
    """``value`` if it is a string, else None: a record read from a file may hold anything."""
    return value if isinstance(value, str) else None


def as_number(value: object) -> float | None:
    """``value`` as a float if it is a number (not a boolean), else None."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value)
