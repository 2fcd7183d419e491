"""The runs and batches lists of the viewer: what a page's address asks for (status, tag, dates,
rows per page, where the page starts), and the links to the pages around it.

The server filters and pages, as ``GET /v1/runs`` and ``GET /v1/batches`` do: the browser only
ever gets one page of rows, with how many match in all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, date, datetime, timedelta
from typing import Any

from api.http.viewer.query import QueryReader, query_link
from api.state.listing import TAG_PATTERN, Listed, ListQuery, is_cursor

PER_PAGE_CHOICES = (25, 50, 100, 200)
RUN_STATUSES = ("queued", "running", "succeeded", "failed", "cancelled")
BATCH_STATUSES = ("queued", "running", "succeeded", "failed")
_TAG = re.compile(TAG_PATTERN)
_A_TAG = "a tag: 1 to 64 letters, digits or ._:/=- (starting with a letter or digit)"
_A_DAY = "a date such as 2024-05-31"
_NOT_A_PAGE = "the page asked for is not one of this list: showing the first"


@dataclass(frozen=True)
class ListFilters:
    """A list page's query as its form and links carry it; empty filters match everything."""

    status: str = ""
    tag: str = ""
    #: Days (YYYY-MM-DD, UTC), both included.
    created_from: str = ""
    created_to: str = ""
    per_page: int = PER_PAGE_CHOICES[0]
    cursor: str = ""

    @classmethod
    def parse(
        cls, params: Mapping[str, str], statuses: Sequence[str]
    ) -> tuple[ListFilters, list[str]]:
        """The query in ``params``; what could not be read is left out and said why."""
        read = QueryReader(params)
        read.choice("status", statuses, "status")
        read.check("tag", _TAG.match, lambda tag: f"tag {tag!r} is not {_A_TAG}")
        read.check("created_from", _day, lambda day: f"from {day!r} is not {_A_DAY}")
        read.check("created_to", _day, lambda day: f"to {day!r} is not {_A_DAY}")
        read.per_page(PER_PAGE_CHOICES)
        read.check("cursor", is_cursor, lambda _: _NOT_A_PAGE)
        return cls(**read.values), read.problems

    @property
    def filtered(self) -> bool:
        return any((self.status, self.tag, self.created_from, self.created_to))

    def query(self) -> ListQuery:
        """The store's query: the days as the instants that bound them."""
        start = _day(self.created_from) if self.created_from else None
        end = _day(self.created_to) if self.created_to else None
        return ListQuery(
            limit=self.per_page,
            cursor=self.cursor or None,
            status=self.status or None,
            tag=self.tag or None,
            created_after=start.timestamp() if start else None,
            created_before=_day_after(end) if end else None,
        )

    def link(self, **changes: Any) -> str:
        """``?...`` for this query with ``changes``; empty values are left out."""
        return query_link(self, **changes)


@dataclass(frozen=True)
class Pager:
    """Where a page of a list is, for its heading and its links."""

    first: int
    last: int
    total: int
    page: int
    pages: int
    #: The links to the newest page and the next older one; None where there is none.
    newest: str | None
    older: str | None


def pager(listed: Listed[Any], filters: ListFilters) -> Pager:
    shown = len(listed.rows)
    return Pager(
        first=listed.start + 1 if shown else 0,
        last=listed.start + shown,
        total=listed.total,
        page=listed.start // filters.per_page + 1,
        pages=max(math.ceil(listed.total / filters.per_page), 1),
        newest=filters.link(cursor="") if listed.start else None,
        older=filters.link(cursor=listed.next_cursor) if listed.next_cursor else None,
    )


def _day_after(day: datetime) -> float | None:
    """The instant the day after ``day`` starts; None past the calendar's last day."""
    try:
        return (day + timedelta(days=1)).timestamp()
    except OverflowError:
        return None


def _day(text: str) -> datetime | None:
    """Midnight UTC at the start of the day ``text`` (YYYY-MM-DD) names; None if it names none."""
    try:
        day = date.fromisoformat(text)
    except ValueError:
        return None
    return datetime(day.year, day.month, day.day, tzinfo=UTC)
