"""Event streams start a few at a time, and nothing else waits for them: the admission in front
of the app, driven as an ASGI server drives it."""

from __future__ import annotations

import asyncio

import pytest
from starlette.types import Message, Receive, Scope, Send

from api.http.admission import StreamAdmission

AT_ONCE = 3


class GatedApp:
    """An app whose every request waits for ``gate`` before it sends its head; it counts the
    requests that have begun."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.begun: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.begun.append(scope["path"])
        if scope["path"] == "/v1/runs/boom/events":
            raise RuntimeError("the stream failed before its head")
        if scope["path"] != "/healthz":
            await self.gate.wait()  # bound: the test opens the gate or cancels the request
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"", "more_body": True})
        await asyncio.Event().wait()  # bound: cancelled; only the stream's head matters here


def request(path: str) -> Scope:
    return {"type": "http", "path": path, "method": "GET", "headers": []}


async def nothing() -> Message:
    await asyncio.Event().wait()  # bound: a receive that the app's cancel ends
    raise AssertionError("unreachable")


async def call(app: StreamAdmission, path: str, heads: list[str]) -> None:
    async def send(message: Message) -> None:
        if message["type"] == "http.response.start":
            heads.append(path)

    await app(request(path), nothing, send)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0)


async def test_streams_past_the_limit_wait_before_their_work_and_the_rest_go_straight_in() -> None:
    inner = GatedApp()
    app = StreamAdmission(inner, at_once=AT_ONCE)
    heads: list[str] = []
    streams = [
        asyncio.create_task(call(app, f"/v1/runs/r{n}/events", heads)) for n in range(AT_ONCE + 5)
    ]
    live = asyncio.create_task(call(app, "/ui/live/runs/r9", heads))
    await settle()
    assert len(inner.begun) == AT_ONCE  # the others have cost nothing yet

    health = asyncio.create_task(call(app, "/healthz", heads))
    listing = asyncio.create_task(call(app, "/v1/runs", heads))
    await settle()
    assert "/healthz" in heads  # answered while the streams wait
    assert "/v1/runs" in inner.begun

    inner.gate.set()
    await settle()
    assert len([path for path in heads if path.endswith("/events")]) == AT_ONCE + 5
    assert "/ui/live/runs/r9" in heads
    for task in [*streams, live, health, listing]:
        task.cancel()
    await asyncio.gather(*streams, live, health, listing, return_exceptions=True)


async def test_a_stream_that_fails_or_is_given_up_frees_its_place() -> None:
    inner = GatedApp()
    app = StreamAdmission(inner, at_once=1)
    heads: list[str] = []
    with pytest.raises(RuntimeError):
        await call(app, "/v1/runs/boom/events", heads)
    first = asyncio.create_task(call(app, "/v1/runs/a/events", heads))
    second = asyncio.create_task(call(app, "/v1/runs/b/events", heads))
    await settle()
    assert inner.begun[-1] == "/v1/runs/a/events"
    first.cancel()  # its client went away before its head
    await asyncio.gather(first, return_exceptions=True)
    await settle()
    assert inner.begun[-1] == "/v1/runs/b/events"
    second.cancel()
    await asyncio.gather(second, return_exceptions=True)
