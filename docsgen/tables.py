"""Markdown tables whose cells hold any text."""

from __future__ import annotations

from collections.abc import Iterable, Sequence


def prose(text: str) -> str:
    """``text`` with its angle brackets outside code spans written as entities: ``<run_id>``
    would otherwise be read as an HTML tag, and vanish."""
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # the even parts are outside code spans
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "`".join(parts)


def cell(text: str) -> str:
    """``text`` as one table cell: on one line, its pipes escaped."""
    return prose(" ".join(text.split()).replace("|", "\\|"))


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)
