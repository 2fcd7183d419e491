"""The caller side: send a tool call to the pool that serves it, await the answer from asyncio.

Calls go out through one publishing thread, which sends whatever has queued up since its last
send as one batch (one Redis round trip on a Redis broker). Answers come back through one
Redis list per dispatcher, drained by one reader task. A thousand calls in flight cost a
thousand futures, not a thousand threads or connections.

An answer is taken only when it is the call's own, sealed with a key of the call's alone derived
from the fleet secret, which no message carries;
calls lost before they started are sent again, and a call's deadline gets a true account of it
(``api.calls.call_watch``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
import uuid
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, Unpack

import redis.asyncio as aioredis
from celery import Celery

from api.calls.broker import producer_app
from api.calls.call_watch import CallWatch, InFlight
from api.calls.pins import RunPins
from api.calls.publishing import SEND_BATCH, CallPublisher
from api.calls.session_pins import SessionPins
from worker.contract.deadlines import CallFields, limited_request
from worker.contract.keys import keys
from worker.contract.network import NetworkChoice
from worker.contract.run_limits import RunLimits
from worker.contract.settings import FleetSettings
from worker.contract.wire import (
    ToolCallRequest,
    ToolCallResult,
    ToolSpec,
)
from worker.plumbing.jobs.replies import RECONNECT, ReplyReader

log = logging.getLogger(__name__)
#: A call that cannot be sent is answered this long before its deadline, so that the caller
#: hears why rather than only that no answer came.
_ANSWER_MARGIN_S = 0.5
#: The connections a dispatcher holds to the result store at most, however many calls wait:
#: its reads are batched (a transaction for all the calls due at once), so a few suffice, and
#: more than the bound wait for one rather than fail with "Too many connections".
REDIS_CONNECTIONS = 16
#: How long a read waits for a free connection before it fails as the store being unreachable.
CONNECTION_WAIT_S = 20.0


@dataclass(frozen=True, slots=True)
class _Outgoing:
    #: The message to send: the call's first, or one sent again (``send_number`` > 1).
    request: ToolCallRequest
    flight: InFlight


class Dispatcher:
    """Sends ``ToolCallRequest``s as Celery tasks and resolves their results."""

    def __init__(
        self, settings: FleetSettings, *, redis_connections: int = REDIS_CONNECTIONS
    ) -> None:
        self._settings = settings
        self._app = _fail_fast(producer_app(settings))
        self._redis = result_store_client(settings.redis_url, redis_connections)
        self.id = uuid.uuid4().hex
        self.reply_key = keys.reply(self.id)
        self._pending: dict[str, InFlight] = {}
        self._watch = CallWatch(self._redis, settings, self._pending, self._send_again, self.id)
        self._watcher: asyncio.Task[None] | None = None
        self._replies = ReplyReader(
            self._redis,
            self.reply_key,
            ToolCallResult,
            self._pending,
            attrgetter("task_id"),
            self._accept,
            malformed=self._malformed,
        )
        # Kombu's producers are not thread-safe and publishing blocks: one thread sends
        # everything, whatever the number of calls in flight.
        self._outbox: queue.SimpleQueue[_Outgoing | None] = queue.SimpleQueue()
        self._sender: threading.Thread | None = None
        #: What the sending thread publishes the calls with.
        self._publisher = CallPublisher(self._app, settings)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closing = False
        #: The runs whose sandbox calls go to the worker holding their container.
        self.pins = RunPins()
        #: The runs whose sandbox calls go to the worker holding their shell sessions.
        self.session_pins = SessionPins()
        #: Each run's network other than "none", by run id: every call of the run carries it
        #: (``worker.egress``). Set by whoever runs the run, for as long as it runs.
        self.networks: dict[str, NetworkChoice] = {}
        #: Each run's own limits, by run id: every call of the run that names none carries them
        #: (a worker's run_bash applies them). Set by whoever runs the run, while it runs.
        self.limits: dict[str, RunLimits] = {}

    @property
    def redis(self) -> aioredis.Redis:
        return self._redis

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    @property
    def refused_answers(self) -> int:
        """Answers refused since the start because they were not their call's own."""
        return self._watch.refused

    async def start(self) -> None:
        if not self._replies.started:
            self._loop = asyncio.get_running_loop()
            self._replies.start("toolq-replies")
            self._watcher = asyncio.create_task(
                self._watch.watch(lambda: self._closing), name="toolq-call-watch"
            )
            self._sender = threading.Thread(target=self._send_loop, name="toolq-send", daemon=True)
            self._sender.start()

    async def close(self) -> None:
        self._closing = True
        if self._watcher is not None:
            self._watcher.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._watcher
            self._watcher = None
        await self._replies.stop()
        if self._sender is not None:
            self._outbox.put(None)
            self._sender = None
        await self._redis.aclose()

    async def __aenter__(self) -> Dispatcher:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def build_request(self, spec: ToolSpec, **call: Unpack[CallFields]) -> ToolCallRequest:
        """A request whose deadline follows the tool's limit, clamped to the fleet's maximum,
        with time for the worker's hard limit and for the reply to come back."""
        return limited_request(
            self._settings,
            spec,
            now=time.time(),
            wait_beyond_limit_s=self._settings.hard_limit_grace_s + self._settings.reply_margin_s,
            reply_to=self.reply_key,
            **call,
        )

    async def call(self, request: ToolCallRequest, pool: str) -> ToolCallResult:
        """Send one call and wait for its answer until its deadline; never raises for failures.
        A sandbox call of a run with an image goes to the worker that holds the run's container
        (``api.calls.pins``); one of a run with shell sessions, to the worker that holds them
        (``api.calls.session_pins``)."""
        network = self.networks.get(request.run_id)
        if network is not None and request.network != network:
            request = request.model_copy(update={"network": network})
        limits = self.limits.get(request.run_id)
        if limits is not None and request.limits is None:
            request = request.model_copy(update={"limits": limits})
        if self.pins.get(request.run_id) is None:
            placed = await self.session_pins.place(request, pool, self._redis)
            if isinstance(placed, ToolCallResult):
                return placed
            request, pool = placed
        result = await self.pins.call(request, pool, self._send_and_wait, self._redis)
        return self.session_pins.settle(request, pool, result)

    async def _send_and_wait(self, request: ToolCallRequest, pool: str) -> ToolCallResult:
        if not self._replies.started:
            await self.start()
        flight = InFlight(request, pool, asyncio.get_running_loop().create_future())
        self._pending[request.task_id] = flight
        sent_at = time.monotonic()
        self._outbox.put(_Outgoing(request, flight))
        try:
            # The answer comes from the reply list or the store, or from the sender when
            # sending failed.
            async with asyncio.timeout(max(request.deadline - time.time(), 0.01)):
                return await flight.answer
        except TimeoutError:
            return await self._watch.last_word(flight, time.monotonic() - sent_at)
        finally:
            self._pending.pop(request.task_id, None)

    def _send_again(self, flight: InFlight) -> None:
        """The call's next message, with the same id (so the same seal): whichever a worker
        starts first runs, and any other is dropped by the start marker."""
        number = flight.request.send_number + 1
        flight.request = flight.request.model_copy(update={"send_number": number})
        flight.sent_at = None
        self._outbox.put(_Outgoing(flight.request, flight))

    def _send_loop(self) -> None:
        """The sending thread: whatever has queued up goes out together.

        Calls that could not be sent are tried again, with what has queued up since, after a
        growing pause, for as long as their deadlines allow: a broker that blinks costs a
        delay, and one that stays away is reported before the callers' deadlines pass.
        """
        # Held between batches: taking a producer from Celery's pool for each would cost a
        # good part of a lone call's publish.
        producer: Any = None
        unsent: list[_Outgoing] = []
        failures = 0
        while True:
            pause = RECONNECT.delay(failures) if unsent else None
            if not self._take(unsent, pause):
                break
            tried_at = time.monotonic()
            try:
                producer = producer or self._app.producer_pool.acquire(block=True)
                while unsent:
                    self._send(unsent[:SEND_BATCH], producer)
                    del unsent[:SEND_BATCH]  # sent: not sent again if a later part fails
            except Exception as exc:
                # A producer that failed is not trusted again.
                if producer is not None:
                    _release(producer)
                producer = None
                failures += 1
                if failures == 1:
                    log.warning("cannot send tool calls (%s); trying again", exc)
                # The next try may take as long as this one did (kombu's own reconnecting).
                took = time.monotonic() - tried_at
                unsent = self._give_up_on(unsent, exc, RECONNECT.delay(failures) + took)
            else:
                failures = 0
        if producer is not None:
            _release(producer)

    def _take(self, unsent: list[_Outgoing], pause: float | None) -> bool:
        """Add to ``unsent`` what the outbox holds: after waiting for the first call when
        ``pause`` is None, else what comes during the whole pause. False once closing."""
        if pause is None:
            item = self._outbox.get()
            while item is not None:
                unsent.append(item)
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    return True
            return False
        until = time.monotonic() + pause
        while (left := until - time.monotonic()) > 0:
            try:
                item = self._outbox.get(timeout=left)
            except queue.Empty:
                break
            if item is None:
                return False
            unsent.append(item)
        return True

    def _send(self, batch: list[_Outgoing], producer: Any) -> None:
        # Should it fail, delivery of the batch is uncertain and it is sent again: a duplicate
        # is answered once, since results are stored once per call.
        self._publisher.send([(item.request, item.flight.pool) for item in batch], producer)
        sent_at = time.monotonic()
        for item in batch:
            item.flight.sent_at = sent_at

    def _give_up_on(
        self, unsent: list[_Outgoing], exc: Exception, next_try_s: float
    ) -> list[_Outgoing]:
        """Answer the calls whose deadline comes before the next try is over (``next_try_s``
        from now); the others stay. A message sent again is dropped instead: its call went out
        once, and may run, so its deadline answers for it."""
        cutoff = time.time() + next_try_s + _ANSWER_MARGIN_S
        late = [
            item
            for item in unsent
            if item.request.deadline <= cutoff and item.request.send_number == 1
        ]
        if late:
            assert self._loop is not None
            failed = [(item, _unsent(item.request, item.flight.pool, exc)) for item in late]
            try:
                self._loop.call_soon_threadsafe(_answer_failures, failed)
            except RuntimeError:  # the loop is closed: nobody waits any more
                return []
        return [item for item in unsent if item.request.deadline > cutoff]

    def _accept(self, flight: InFlight, result: ToolCallResult) -> None:
        if not self._watch.is_own(result, flight):
            self._watch.refuse(result.task_id, "a reply")
            return
        flight.answer.set_result(result)

    def _malformed(self, _: bytes | str) -> None:
        self._watch.refused += 1


def result_store_client(redis_url: str, connections: int) -> aioredis.Redis:
    """A client of at most ``connections`` connections, where a command finding them all busy
    waits for one (up to ``CONNECTION_WAIT_S``) instead of failing at once."""
    pool = aioredis.BlockingConnectionPool.from_url(
        redis_url,
        max_connections=connections,
        timeout=CONNECTION_WAIT_S,
        health_check_interval=30,
    )
    return aioredis.Redis.from_pool(pool)


def _unsent(request: ToolCallRequest, pool: str, exc: Exception) -> ToolCallResult:
    return ToolCallResult.failure(
        request,
        "broker_unavailable",
        f"Error: the call to {request.tool} could not be sent to the {pool!r} queue: "
        f"{type(exc).__name__}: {exc}",
    )


def _fail_fast(app: Celery) -> Celery:
    """Connecting gives up at once: the sending loop tries again for as long as each call's
    deadline allows, and kombu's own reconnecting would hold it several seconds per try."""
    options = dict(app.conf.broker_transport_options or {})
    options.update(max_retries=1, interval_start=0, interval_step=0.1, interval_max=0.1)
    app.conf.broker_transport_options = options
    return app


def _release(producer: Any) -> None:
    with contextlib.suppress(Exception):
        producer.release()


def _answer_failures(failed: list[tuple[_Outgoing, ToolCallResult]]) -> None:
    for item, result in failed:
        if not item.flight.answer.done():
            item.flight.answer.set_result(result)
