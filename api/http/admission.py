"""Event streams start a few at a time, so that a burst of followers leaves the health probe
answering at once.

One event loop serves every request of a replica, in turn. When a thousand clients open a run's
events at once, each one's start (the token, the run's record, the events it holds already) is
work queued on that loop, and a ``/healthz`` arriving behind them waited for all of it: seconds,
past a probe's timeout. Here a stream that arrives while ``STARTING_AT_ONCE`` others are starting
waits, before any of its work, until one of them has sent its response's head; what waits costs
the loop nothing, and any other request (the probe among them) goes straight in.
"""

from __future__ import annotations

import asyncio
import re

from starlette.types import ASGIApp, Message, Receive, Scope, Send

#: Event streams that may be starting at once: enough to keep starts flowing on the replica's
#: Redis connections, few enough that a request behind them waits for little.
STARTING_AT_ONCE = 32
#: The paths of event streams: the API's and the viewer's live pages.
EVENT_STREAM_PATH = re.compile(r"^/v1/runs/[^/]+/events$|^/ui/live/")


class StreamAdmission:
    """Lets at most ``at_once`` event streams start together; other requests pass untouched."""

    def __init__(self, app: ASGIApp, at_once: int = STARTING_AT_ONCE) -> None:
        self.app = app
        self._starting = asyncio.Semaphore(at_once)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not EVENT_STREAM_PATH.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        await self._starting.acquire()
        started = False

        def leave() -> None:
            nonlocal started
            if not started:
                started = True
                self._starting.release()

        async def send_then_leave(message: Message) -> None:
            # Its head is out: the stream has started, and waits for events like any other.
            if message["type"] == "http.response.start":
                leave()
            await send(message)

        try:
            await self.app(scope, receive, send_then_leave)
        finally:
            leave()
