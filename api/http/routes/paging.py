"""The query parameters of every list of runs or batches: the page (cursor, limit) and the
filters they share (tag, creation time); each list adds its own statuses."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Query

from api.http.state.listing import CURSOR_PATTERN, TAG_PATTERN, ListQuery

#: The most records one page of a list holds.
MAX_LIMIT = 1000


def _list_query(
    cursor: Annotated[
        str | None,
        Query(
            pattern=CURSOR_PATTERN,
            description="Where the previous page ended: its next_cursor. Omit for the newest.",
        ),
    ] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_LIMIT, description="Records per page.")] = 100,
    tag: Annotated[
        str | None,
        Query(pattern=TAG_PATTERN, description="Only those started with this tag."),
    ] = None,
    created_after: Annotated[
        datetime | None,
        Query(
            description="Only those created at or after this time: ISO 8601 (UTC unless it "
            "says otherwise) or epoch seconds."
        ),
    ] = None,
    created_before: Annotated[
        datetime | None,
        Query(description="Only those created before this time, as created_after."),
    ] = None,
) -> ListQuery:
    return ListQuery(
        limit=limit,
        cursor=cursor,
        tag=tag,
        created_after=_epoch(created_after),
        created_before=_epoch(created_before),
    )


def _epoch(moment: datetime | None) -> float | None:
    if moment is None:
        return None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


#: A list route's parameter of this type is given the page and filters its query asks for.
ListParams = Annotated[ListQuery, Depends(_list_query)]
