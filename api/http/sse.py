"""A run's events as server-sent events: what happened so far, then live, then ``done``.

What the run's stream holds is read from Redis at once; live events come from the replica's
``EventHub``, so a stream that waits holds no Redis connection. The API's
``/v1/runs/{id}/events`` and the viewer's live run page serve the same stream.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from typing import Any

from fastapi.responses import StreamingResponse
from redis.exceptions import RedisError

from api.http.event_hub import EventHub
from api.state.records import ACTIVE, DONE
from api.state.runs import RunStore

log = logging.getLogger(__name__)

#: An SSE stream sends a comment this often while nothing happens (and checks the run is alive),
#: however long that lasts: a model may think for minutes.
SSE_IDLE_S = 5.0
#: What it sends: a comment, which clients ignore and which keeps proxies from closing it.
KEEP_ALIVE = b": keep-alive\n\n"
#: Events one read of what a run's stream holds takes.
STORED_READ_COUNT = 500
#: Headers that keep proxies from buffering or caching a stream.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def sse_response(frames: AsyncIterator[bytes]) -> StreamingResponse:
    """A stream of server-sent events (the API's and the viewer's), which proxies pass on as
    it comes."""
    return StreamingResponse(frames, media_type="text/event-stream", headers=STREAM_HEADERS)


async def run_event_stream(
    store: RunStore, hub: EventHub, run_id: str, after: str, *, ended: bool = False
) -> AsyncGenerator[bytes, None]:
    """The stream's frames; it ends with ``done``, or early (and quietly) when Redis fails,
    after which the client comes back with Last-Event-ID."""
    try:
        async for frame in _frames(store, hub, run_id, after, ended=ended):
            yield frame
    except RedisError as exc:
        log.warning("the event stream of run %s ended early: Redis failed: %s", run_id, exc)


async def _frames(
    store: RunStore, hub: EventHub, run_id: str, after: str, *, ended: bool
) -> AsyncIterator[bytes]:
    while True:  # again after falling behind the replica's reader of live events
        # What the stream holds already, read at once.
        for entry_id, event in await _stored_events(store, run_id, after):
            after = entry_id
            yield event_frame(entry_id, event)
            if event.get("type") == DONE:
                return
        if ended:
            # Its events expired (or were trimmed) before its end was read: say how it ended.
            yield await _ending(store, run_id)
            return
        with hub.follow(run_id, after) as feed:
            # The reader hands out what it reads from now on; what came before is in Redis.
            arrived = await _stored_events(store, run_id, after)
            while not feed.fell_behind:
                for entry_id, event in arrived:
                    if _position(entry_id) <= _position(after):
                        continue  # read from Redis already
                    after = entry_id
                    yield event_frame(entry_id, event)
                    if event.get("type") == DONE:
                        return
                arrived = await feed.take(SSE_IDLE_S)
                if arrived or feed.fell_behind:
                    continue
                # Quiet: is the run still going? Reading it also fails a run whose replica died.
                state = await store.get_run(run_id)
                if state is None or state.status not in ACTIVE:
                    ended = True
                    break
                yield KEEP_ALIVE


async def _stored_events(
    store: RunStore, run_id: str, after: str
) -> list[tuple[str, dict[str, Any]]]:
    """Every event after ``after`` that the run's stream holds now, read without waiting."""
    found: list[tuple[str, dict[str, Any]]] = []
    while True:
        entries = await store.read_events(run_id, after, block_ms=0, count=STORED_READ_COUNT)
        found += entries
        if len(entries) < STORED_READ_COUNT:
            return found
        after = entries[-1][0]


async def _ending(store: RunStore, run_id: str) -> bytes:
    """A ``done`` made from the run's record, for a run whose own ``done`` is gone."""
    state = await store.get_run(run_id)
    status = state.status if state else "unknown"
    error = state.error if state else "the run's record has expired"
    return event_frame("0", {"type": DONE, "status": status, "error": error, "stop_reason": None})


def _position(entry_id: str) -> tuple[int, int]:
    """A stream id (``<ms>-<seq>``, or ``<ms>`` for ``<ms>-0``) in the stream's order."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def event_frame(entry_id: str, event: Mapping[str, Any]) -> bytes:
    """One server-sent event: its stream id, its type as the event name, its JSON."""
    data = json.dumps(event, separators=(",", ":"))
    return f"id: {entry_id}\nevent: {event.get('type', 'message')}\ndata: {data}\n\n".encode()
