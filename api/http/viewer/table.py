"""A batch's items as a table: the query a page asks for, and the rows that answer it.

Filters, sort and paging are applied on the server, over summaries: the browser only ever gets
one page of rows, however many items the batch has.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

from api.batch.summary import ItemSummary
from api.http.viewer.query import QueryReader, query_link

PER_PAGE_CHOICES = (25, 50, 100, 200)
STATUSES = ("ok", "error", "unreadable")
STOP_REASONS = ("answered", "max_turns")
SCORES = ("passed", "failed", "unscored")
TOOL_ERRORS = ("some", "none")

#: Column name -> what it sorts by (None sorts last whichever the order).
SORT_KEYS: dict[str, Callable[[ItemSummary], Any]] = {
    "id": lambda s: s.id,
    "status": lambda s: s.status,
    "stop_reason": lambda s: s.stop_reason,
    "score": lambda s: s.passed,
    "duration": lambda s: s.duration_s,
    "tokens": lambda s: s.tokens,
    "tool_calls": lambda s: s.tool_calls,
    "tool_errors": lambda s: s.tool_errors,
}
#: The order results finished in (the item's number): the default, and what needs no index.
FINISHED = "finished"


@dataclass(frozen=True)
class ItemQuery:
    """What a batch page shows: filters, sort and page. Empty filters match everything."""

    status: str = ""
    stop_reason: str = ""
    score: str = ""
    tool_errors: str = ""
    min_duration: float | None = None
    max_duration: float | None = None
    min_tokens: int | None = None
    max_tokens: int | None = None
    q: str = ""
    sort: str = FINISHED
    order: str = "asc"
    page: int = 1
    per_page: int = 50

    @classmethod
    def parse(cls, params: Mapping[str, str]) -> tuple[ItemQuery, list[str]]:
        """The query in ``params``; what could not be read is left out and said why."""
        read = QueryReader(params)
        read.choice("status", STATUSES, "status")
        read.choice("stop_reason", (*STOP_REASONS, "none"), "stop reason")
        read.choice("score", SCORES, "score")
        read.choice("tool_errors", TOOL_ERRORS, "tool errors")
        read.choice("sort", (FINISHED, *SORT_KEYS), "sort")
        read.choice("order", ("asc", "desc"), "order")
        read.number("min_duration", "shortest duration", float)
        read.number("max_duration", "longest duration", float)
        read.number("min_tokens", "fewest tokens", int)
        read.number("max_tokens", "most tokens", int)
        read.number("page", "page", int)
        read.per_page(PER_PAGE_CHOICES)
        page = max(int(read.values.pop("page", 1)), 1)
        return cls(**read.values, page=page, q=read.given("q")), read.problems

    @property
    def filtered(self) -> bool:
        return any(
            getattr(self, f.name) not in ("", None)
            for f in fields(self)
            if f.name not in ("sort", "order", "page", "per_page")
        )

    @property
    def plain(self) -> bool:
        """All items in the order they finished: a page of it is a slice, with no index."""
        return not self.filtered and self.sort == FINISHED and self.order == "asc"

    def matches(self, item: ItemSummary) -> bool:
        checks = (
            not self.status or item.status == self.status,
            not self.stop_reason or (item.stop_reason or "none") == self.stop_reason,
            not self.score or _score_name(item.passed) == self.score,
            not self.tool_errors or (item.tool_errors > 0) == (self.tool_errors == "some"),
            _within(item.duration_s, self.min_duration, self.max_duration),
            _within(item.tokens, self.min_tokens, self.max_tokens),
            not self.q or self.q.casefold() in item.searchable,
        )
        return all(checks)

    def link(self, **changes: Any) -> str:
        """This query with ``changes``, as a query string (only what differs from defaults)."""
        return query_link(self, **changes)

    def sort_link(self, column: str) -> str:
        """Sort by ``column``; a second click on the sorted column reverses the order."""
        order = "desc" if self.sort == column and self.order == "asc" else "asc"
        return self.link(sort=column, order=order, page=1)

    def aria_sort(self, column: str) -> str:
        if self.sort != column:
            return "none"
        return "ascending" if self.order == "asc" else "descending"


@dataclass(frozen=True)
class ItemPage:
    """One page of items, each with its number (1 = the first to finish)."""

    rows: list[tuple[int, ItemSummary]]
    matching: int
    page: int
    per_page: int

    @property
    def pages(self) -> int:
        return max(math.ceil(self.matching / self.per_page), 1)

    @property
    def first(self) -> int:
        return (self.page - 1) * self.per_page + 1 if self.rows else 0

    @property
    def last(self) -> int:
        return self.first + len(self.rows) - 1 if self.rows else 0


def select(summaries: Sequence[ItemSummary], query: ItemQuery) -> ItemPage:
    """The page of ``summaries`` (every item, in the order they finished) ``query`` asks for."""
    numbered = [(n, s) for n, s in enumerate(summaries, start=1) if query.matches(s)]
    if query.sort in SORT_KEYS:
        numbered = _sorted(numbered, SORT_KEYS[query.sort], descending=query.order == "desc")
    elif query.order == "desc":
        numbered.reverse()
    start = (query.page - 1) * query.per_page
    rows = numbered[start : start + query.per_page]
    return ItemPage(rows, len(numbered), query.page, query.per_page)


def plain_page(first: Sequence[ItemSummary], total: int, query: ItemQuery) -> ItemPage:
    """A page of the plain order from the slice starting at the page's first item."""
    start = (query.page - 1) * query.per_page
    rows = list(enumerate(first[: query.per_page], start=start + 1))
    return ItemPage(rows, total, query.page, query.per_page)


def _sorted(
    rows: list[tuple[int, ItemSummary]], key: Callable[[ItemSummary], Any], *, descending: bool
) -> list[tuple[int, ItemSummary]]:
    present = [row for row in rows if key(row[1]) is not None]
    absent = [row for row in rows if key(row[1]) is None]
    # Stable either way: equal values stay in the order they finished.
    present.sort(key=lambda row: key(row[1]), reverse=descending)
    return present + absent


def _within(value: float | None, low: float | None, high: float | None) -> bool:
    if low is None and high is None:
        return True
    if value is None:
        return False
    return (low is None or value >= low) and (high is None or value <= high)


def _score_name(passed: bool | None) -> str:
    return "unscored" if passed is None else ("passed" if passed else "failed")
