"""The query parameters of every list of runs or batches: the page (cursor, limit) and the
filters they share (tag, creation time); each list adds its own statuses."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Query
from pydantic import BeforeValidator, WithJsonSchema

from api.state.listing import CURSOR_PATTERN, TAG_PATTERN, ListQuery

#: The most records one page of a list holds.
MAX_LIMIT = 1000
#: A number as JSON writes one: epoch seconds.
_NUMBER = re.compile(r"^-?(0|[1-9]\d*)(\.\d+)?([eE][+-]?\d+)?$")


def _epoch(value: object) -> float:
    """Epoch seconds of an ISO 8601 time or day (UTC unless it says otherwise), or of epoch
    seconds themselves."""
    text = str(value).strip()
    if _NUMBER.match(text):
        return float(text)
    try:
        moment = datetime.fromisoformat(text)
    except ValueError:
        raise ValueError(
            f"{text!r} is not a time: give ISO 8601 (2024-05-31T12:00:00Z, 2024-05-31) or "
            "epoch seconds"
        ) from None
    return (moment if moment.tzinfo else moment.replace(tzinfo=UTC)).timestamp()


#: A time a list's filter takes, as epoch seconds.
Moment = Annotated[
    float,
    BeforeValidator(_epoch),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "string", "format": "date-time"},
                {"type": "string", "format": "date"},
                {"type": "number"},
            ]
        }
    ),
]


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
        Moment | None,
        Query(
            description="Only those created at or after this time: ISO 8601 (UTC unless it "
            "says otherwise) or epoch seconds."
        ),
    ] = None,
    created_before: Annotated[
        Moment | None,
        Query(description="Only those created before this time, as created_after."),
    ] = None,
) -> ListQuery:
    return ListQuery(
        limit=limit,
        cursor=cursor,
        tag=tag,
        created_after=created_after,
        created_before=created_before,
    )


#: A list route's parameter of this type is given the page and filters its query asks for.
ListParams = Annotated[ListQuery, Depends(_list_query)]
