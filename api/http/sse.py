"""A run's events as server-sent events: what happened so far, then live, then ``done``.

The API's ``/v1/runs/{id}/events`` and the viewer's live run page serve the same stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from fastapi.responses import StreamingResponse

from api.http.state.keys import ACTIVE, DONE
from api.http.state.runs import RunStore

#: An SSE stream sends a comment this often while nothing happens (and checks the run is alive).
SSE_IDLE_S = 5.0
#: Headers that keep proxies from buffering or caching a stream.
STREAM_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def event_stream_response(
    store: RunStore, run_id: str, after: str, *, ended: bool
) -> StreamingResponse:
    """The events of ``run_id`` after the stream id ``after`` ("0" for all); ``ended`` says the
    run had ended before the stream began."""
    return StreamingResponse(
        run_event_stream(store, run_id, after, ended=ended),
        media_type="text/event-stream",
        headers=STREAM_HEADERS,
    )


async def run_event_stream(
    store: RunStore, run_id: str, after: str, *, ended: bool = False
) -> AsyncIterator[bytes]:
    # A run that had ended has all its events in the stream: nothing is worth waiting for.
    ended_before = ended
    while True:
        wait_ms = 0 if ended_before else int(SSE_IDLE_S * 1000)
        entries = await store.read_events(run_id, after, block_ms=wait_ms)
        for entry_id, event in entries:
            after = entry_id
            yield event_frame(entry_id, event)
            if event.get("type") == DONE:
                return
        if entries:
            continue
        # Quiet: is the run still going? Reading it also fails a run whose replica died.
        state = await store.get_run(run_id)
        if state is None or (state.status not in ACTIVE and ended_before):
            # Its events expired (or were trimmed) before its end was read: say how it ended.
            status = state.status if state else "unknown"
            error = state.error if state else "the run's record has expired"
            done = {"type": DONE, "status": status, "error": error, "stop_reason": None}
            yield event_frame("0", done)
            return
        ended_before = state.status not in ACTIVE
        yield b": keep-alive\n\n"


def event_frame(entry_id: str, event: Mapping[str, Any]) -> bytes:
    """One server-sent event: its stream id, its type as the event name, its JSON."""
    data = json.dumps(event, separators=(",", ":"))
    return f"id: {entry_id}\nevent: {event.get('type', 'message')}\ndata: {data}\n\n".encode()
