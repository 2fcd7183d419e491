"""Lists of runs and batches: one tenant's, newest first, filtered by status, tag and creation
time, a page at a time behind a cursor, with how many match in all.

A tenant's index (a sorted set by creation time, ``keys.runs_index_key``) names its records; the
filters read three small fields of each (status, tags, tenant) in one round trip, and only the
page's records are read whole. A cursor is where a page ended, the creation time and id of its
last record: any cursor of the right form is a place in the list, even one whose record has
expired since, so the next page never repeats or skips a record that is still there.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar, cast

import redis.asyncio as aioredis

from api.state.records import ACTIVE, owned_by, text

#: A cursor: the creation time (epoch seconds) and the id of the last record of a page.
CURSOR_PATTERN = r"^\d{1,12}(\.\d{1,20})?~[A-Za-z0-9._-]{1,200}$"
_CURSOR = re.compile(CURSOR_PATTERN)
#: A tag: what a run or batch is labelled with when it starts, and what a list filters by.
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/=-]{0,63}$"
MAX_TAGS = 20
#: The fields the filters read of every record in the time range.
_FILTERED = ("status", "tags", "tenant")

T = TypeVar("T")
U = TypeVar("U")


@dataclass(frozen=True)
class ListQuery:
    """Which records a list shows: filters (None: any) and the page."""

    limit: int = 100
    #: Where the previous page ended (its ``next_cursor``); None for the newest.
    cursor: str | None = None
    status: str | None = None
    tag: str | None = None
    #: Epoch seconds: created at or after, and before.
    created_after: float | None = None
    created_before: float | None = None


@dataclass(frozen=True)
class Listed(Generic[T]):
    """One page of a list, and where it is in the whole."""

    rows: list[T]
    #: Records matching the filters in all, on every page.
    total: int
    #: How many matching records come before this page.
    start: int
    next_cursor: str | None

    def map(self, convert: Callable[[T], U]) -> Listed[U]:
        return Listed([convert(row) for row in self.rows], self.total, self.start, self.next_cursor)


def is_cursor(value: str) -> bool:
    return _CURSOR.match(value) is not None


def record_tags(fields: dict[str, str]) -> list[str]:
    """A record's tags, from its ``tags`` field (none: records written before tags)."""
    raw = fields.get("tags")
    tags = json.loads(raw) if raw else []
    return [str(tag) for tag in tags] if isinstance(tags, list) else []


async def list_current(
    redis: aioredis.Redis,
    index: str,
    state_key: Callable[[str], str],
    query: ListQuery,
    tenant: str,
    current: Callable[[str], Awaitable[dict[str, str] | None]],
) -> Listed[dict[str, str]]:
    """The page of ``index``'s records (their fields) that ``query`` asks for, newest first;
    records that expired leave the index. Each record still going is read again by ``current``
    (given its id), which may find its replica gone; one that expired meanwhile (None) is left
    out."""
    lowest = "-inf" if query.created_after is None else repr(query.created_after)
    highest = "+inf" if query.created_before is None else f"({query.created_before!r}"
    indexed = cast(
        list[tuple[bytes | str, float]],
        await redis.zrevrangebyscore(index, highest, lowest, withscores=True),
    )
    async with redis.pipeline(transaction=False) as pipe:
        for member, _ in indexed:
            pipe.hmget(state_key(text(member)), list(_FILTERED))
        found: list[list[bytes | str | None]] = await pipe.execute() if indexed else []
    matching: list[tuple[float, str]] = []
    gone: list[str] = []
    for (member, score), values in zip(indexed, found, strict=True):
        record_id = text(member)
        fields = {name: text(v) for name, v in zip(_FILTERED, values, strict=True) if v is not None}
        if "status" not in fields:
            gone.append(record_id)
        elif _matches(fields, query, tenant):
            matching.append((score, record_id))
    if gone:
        await redis.zrem(index, *gone)
    # Newest first; records created in the same instant by id, so the order never changes.
    matching.sort(reverse=True)
    start = _start(matching, query.cursor)
    page = matching[start : start + query.limit]
    rows = [
        # Only a record still going may need its replica's lease looked at.
        await current(fields["id"]) if fields["status"] in ACTIVE else fields
        for fields in await _whole(redis, state_key, [record_id for _, record_id in page])
    ]
    more = start + query.limit < len(matching)
    next_cursor = f"{page[-1][0]!r}~{page[-1][1]}" if page and more else None
    return Listed([row for row in rows if row is not None], len(matching), start, next_cursor)


def _matches(fields: dict[str, str], query: ListQuery, tenant: str) -> bool:
    return (
        owned_by(fields, tenant)
        and (query.status is None or fields["status"] == query.status)
        and (query.tag is None or query.tag in record_tags(fields))
    )


def _start(matching: Sequence[tuple[float, str]], cursor: str | None) -> int:
    """How many records come before the first one after ``cursor``; ``ValueError`` for what
    is not a cursor."""
    if cursor is None:
        return 0
    if not is_cursor(cursor):
        raise ValueError(f"{cursor!r} is not a cursor of this list (a next_cursor it gave)")
    created_at, record_id = cursor.split("~", 1)
    after = (float(created_at), record_id)
    return next((n for n, place in enumerate(matching) if place < after), len(matching))


async def _whole(
    redis: aioredis.Redis, state_key: Callable[[str], str], ids: Sequence[str]
) -> list[dict[str, str]]:
    """Every field of these records, in this order; one that expired meanwhile is left out."""
    if not ids:
        return []
    async with redis.pipeline(transaction=False) as pipe:
        for record_id in ids:
            pipe.hgetall(state_key(record_id))
        found: list[dict[bytes | str, bytes | str]] = await pipe.execute()
    return [
        {text(name): text(value) for name, value in raw.items()}
        for record_id, raw in zip(ids, found, strict=True)
        if raw
    ]
