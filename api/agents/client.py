"""The caller's side of the agents pool: send conversations to the ``agents`` queue, get their
output lines back, and never wait forever.

Answers come back on one reply list per client, drained by one reader, as tool calls' answers do
(``worker.plumbing.jobs``). Every ``tick_s`` one look at all the conversations in flight (one
Redis transaction) decides, for each, the same way a tool call's deadline does:

- an answer stored but not received (the run finished for an earlier caller): taken from Redis;
- a run whose lease is gone without an answer (its agents worker died or was cut off): sent
  again, as a new attempt, up to ``MAX_ATTEMPTS`` runs;
- a run still going past its time limit plus ``TOOLQ_REPLY_MARGIN_S``: answered with an error;
- a send that no worker started while the queue is empty, when an agents worker died since it
  went out or after ``lost_after_s`` (its message went down with a worker that took it): sent
  again;
- no agents worker live for ``no_workers_grace_s``: ``NoAgentsError`` for every conversation not
  started, so that a batch stops and says so rather than waiting.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from operator import attrgetter
from typing import Any

from celery import Celery
from redis.exceptions import RedisError

from api.agents.messages import (
    CONVERSATION_TASK,
    MAX_ATTEMPTS,
    ConversationRequest,
    ConversationResult,
    LiveRun,
)
from api.agents.store import ConversationStore, attempt_of, store_client
from api.batch.items import BatchItem
from api.batch.runner import failed_record
from api.calls.broker import producer_app
from api.calls.fleet import read_queue_depths
from api.conversation.agent_options import AgentOptions
from api.exceptions import NoAgentsError
from api.settings import OrchestratorSettings
from api.state.run_end import RunEnd
from worker.contract.keys import keys
from worker.contract.wire import AGENTS_QUEUE
from worker.plumbing.heartbeat import HEARTBEAT_TTL_S
from worker.plumbing.jobs.replies import ReplyReader

log = logging.getLogger(__name__)

TICK_S = 2.0
#: No agents worker live for this long, and the conversations not started fail: heartbeats come
#: every few seconds, so this is no blink of a broker restart.
NO_WORKERS_GRACE_S = 2.0 * HEARTBEAT_TTL_S
#: A send not started this long after it went out, with the queue empty, was lost.
LOST_AFTER_S = 2.0 * HEARTBEAT_TTL_S
#: Publishing a conversation tries again this way (Celery's publish retry) before giving up.
SEND_RETRY = {"max_retries": 10, "interval_start": 0.1, "interval_step": 0.5, "interval_max": 2.0}

#: The send that may run, once the caller gave up on the pool: no message matches it.
ABANDONED = "abandoned"

NO_WORKERS = (
    "no agents worker is live on this broker: start one (toolq worker --pool agents), or run "
    "without --on-fleet"
)


#: The record of a conversation the pool never answered: (its error, runs started, the worker of
#: the last run, seconds waited).
FailedRecord = Callable[[str, int, str | None, float], dict[str, Any]]


@dataclass(eq=False)
class _Flight:
    """One conversation in flight, as the client last saw it."""

    run_id: str
    #: What the request carries besides its ids: an item and its default model, or a run.
    body: dict[str, Any]
    failed: FailedRecord
    answer: asyncio.Future[dict[str, Any]]
    sent_at: float = 0.0
    #: Runs started before the current send: a higher count means one started since.
    seen_attempts: int = 0
    #: The lease of the run going on (``<attempt> <worker>``), and when it was first seen.
    holder: str | None = None
    started_at: float = 0.0


class ConversationClient:
    """``await client.run(item, run_id=...)`` runs one conversation on an agents worker and
    returns its output line, as ``run_item`` would in this process."""

    def __init__(
        self,
        settings: OrchestratorSettings,
        *,
        celery_app: Celery | None = None,
        tick_s: float = TICK_S,
        no_workers_grace_s: float = NO_WORKERS_GRACE_S,
        lost_after_s: float = LOST_AFTER_S,
    ) -> None:
        self._settings = settings
        self._app = celery_app or producer_app(settings)
        self._redis = store_client(settings.redis_url)
        self._store = ConversationStore(self._redis, settings.result_ttl_s)
        self.id = uuid.uuid4().hex
        self.reply_key = keys.reply(self.id)
        self._tick_s = tick_s
        self._no_workers_grace_s = no_workers_grace_s
        self._lost_after_s = lost_after_s
        self._flights: dict[str, _Flight] = {}
        self._replies = ReplyReader(
            self._redis,
            self.reply_key,
            ConversationResult,
            self._flights,
            attrgetter("conversation_id"),
            lambda flight, result: flight.answer.set_result(result.record),
        )
        # Kombu's producers are not thread-safe and publishing blocks: one thread sends.
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolq-send-agents")
        self._tasks: list[asyncio.Task[None]] = []
        self._no_workers_since: float | None = None
        #: The live agents workers at the last look, and when one of those was last gone.
        self._workers: set[str] = set()
        self._worker_lost_at = float("-inf")
        self._closing = False

    async def __aenter__(self) -> ConversationClient:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    async def start(self) -> None:
        if not self._tasks:
            self._replies.start("toolq-conversation-replies")
            self._tasks = [asyncio.create_task(self._supervise(), name="toolq-conversation-watch")]

    async def close(self) -> None:
        self._closing = True
        await self._replies.stop()
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        self._tasks = []
        self._sender.shutdown(wait=True)
        await self._redis.aclose()

    async def live_workers(self) -> set[str]:
        """The agents workers whose heartbeat has not expired."""
        pattern = keys.worker_heartbeats(AGENTS_QUEUE)
        return {_text(key) async for key in self._redis.scan_iter(pattern, count=1000)}

    async def require_workers(self) -> int:
        """How many agents workers are live; ``NoAgentsError`` when none is."""
        live = await self.live_workers()
        if not live:
            raise NoAgentsError(NO_WORKERS)
        return len(live)

    async def run(
        self, item: BatchItem, *, run_id: str, default_model: str | None = None
    ) -> dict[str, Any]:
        """The conversation's output line; ``NoAgentsError`` when no worker is there to run it.

        A conversation whose run is still going (its earlier caller stopped) is waited for, not
        sent again; one that finished meanwhile is answered from Redis.
        """
        model = item.model or default_model or self._settings.model

        def failed(why: str, attempts: int, ran_on: str | None, waited_s: float) -> dict[str, Any]:
            return failed_record(
                item, run_id, model, why, attempts=attempts, ran_on=ran_on, waited_s=waited_s
            )

        body = {
            "item": item.model_dump(mode="json", exclude_defaults=True),
            "default_model": default_model,
        }
        return await self._converse(run_id, body, failed)

    async def run_live(self, run_id: str, prompt: str, options: AgentOptions) -> dict[str, Any]:
        """Run the HTTP API's run ``run_id`` on an agents worker, which writes its events and
        transcript to the run's record; its end (``api/agents/live_run.py``)."""

        def failed(why: str, attempts: int, ran_on: str | None, _: float) -> dict[str, Any]:
            return RunEnd(status="failed", error=why, attempts=attempts, orchestrator=ran_on).line()

        body = {"run": LiveRun(prompt=prompt, options=options.model_dump(mode="json"))}
        return await self._converse(run_id, body, failed)

    async def _converse(
        self, run_id: str, body: dict[str, Any], failed: FailedRecord
    ) -> dict[str, Any]:
        if run_id in self._flights:
            raise ValueError(f"conversation {run_id!r} is already in flight")
        await self.start()
        flight = _Flight(run_id, body, failed, asyncio.get_running_loop().create_future())
        self._flights[run_id] = flight
        try:
            task_id = self._task_id(run_id)
            prepared = await self._store.prepare(run_id, task_id)
            if prepared.stored is not None:
                _resolve(flight, prepared.stored.record)
            elif prepared.running is not None:
                flight.sent_at = flight.started_at = time.monotonic()
                flight.holder = prepared.running
                flight.seen_attempts = attempt_of(prepared.running) - 1
            else:
                await self._send(flight, task_id)
            record = await flight.answer
        finally:
            self._flights.pop(run_id, None)
        # Taken before it is written: a caller killed in between runs it again, never twice.
        await self._store.consume(run_id)
        return record

    # -- sending -------------------------------------------------------------------------------

    @staticmethod
    def _task_id(run_id: str) -> str:
        return f"{run_id}:{uuid.uuid4().hex[:12]}"

    async def _send(self, flight: _Flight, task_id: str) -> None:
        request = ConversationRequest(
            task_id=task_id,
            conversation_id=flight.run_id,
            timeout_s=self._settings.conversation_timeout_s,
            reply_to=self.reply_key,
            **flight.body,
        )
        flight.sent_at = time.monotonic()
        flight.holder = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self._sender, self._publish, request)

    def _publish(self, request: ConversationRequest) -> None:
        self._app.send_task(
            CONVERSATION_TASK,
            args=[request.model_dump(mode="json")],
            task_id=request.task_id,
            queue=AGENTS_QUEUE,
            routing_key=AGENTS_QUEUE,
            ignore_result=True,
            # What monitors show: the conversation, not its prompt.
            argsrepr=f"(conversation {request.conversation_id!r})",
            kwargsrepr="{}",
            retry=True,
            retry_policy=SEND_RETRY,
        )

    async def _send_again(self, flight: _Flight, seen_attempts: int, why: str) -> None:
        task_id = self._task_id(flight.run_id)
        # Only if nothing changed since the look: a run that started meanwhile goes on alone.
        if await self._store.supersede(flight.run_id, task_id, seen_attempts):
            log.warning("conversation %s: %s; sending it again", flight.run_id, why)
            flight.seen_attempts = seen_attempts
            await self._send(flight, task_id)

    # -- answers -------------------------------------------------------------------------------

    async def _supervise(self) -> None:
        while not self._closing:
            await asyncio.sleep(self._tick_s)
            try:
                await self._look()
            except (RedisError, OSError) as exc:
                log.warning("cannot look at the conversations in flight: %s", exc)

    async def _look(self) -> None:
        flights = [f for f in self._flights.values() if not f.answer.done()]
        if not flights:
            self._no_workers_since = None
            return
        live = await self.live_workers()
        now = time.monotonic()
        self._no_workers_since = None if live else (self._no_workers_since or now)
        if self._workers - live:
            self._worker_lost_at = now
        self._workers = live
        unstarted: list[_Flight] = []
        limit_s = self._settings.conversation_timeout_s + self._settings.reply_margin_s
        seen_all = await self._store.observe([f.run_id for f in flights])
        for flight, seen in zip(flights, seen_all, strict=True):
            if seen.answered:
                stored = await self._store.stored(flight.run_id)
                if stored is not None:
                    _resolve(flight, stored.record)
            elif seen.holder is not None:
                if seen.holder != flight.holder:
                    flight.holder, flight.started_at = seen.holder, now
                elif now - flight.started_at > limit_s:
                    why = f"it started {now - flight.started_at:.0f} s ago and never answered"
                    failed = self._failed(flight, seen.holder, seen.attempts, why, now)
                    _resolve(flight, failed)
            elif seen.attempts > flight.seen_attempts:
                died = f"its agents worker ({_worker_of(flight.holder)}) stopped before it answered"
                if seen.attempts >= MAX_ATTEMPTS:
                    why = f"{died}, {seen.attempts} times; not run again"
                    failed = self._failed(flight, flight.holder, seen.attempts, why, now)
                    _resolve(flight, failed)
                else:
                    await self._send_again(flight, seen.attempts, died)
            else:
                unstarted.append(flight)
        if unstarted:
            await self._not_started(unstarted, now)

    async def _not_started(self, flights: list[_Flight], now: float) -> None:
        if self._no_workers_since is not None:
            gone_s = now - self._no_workers_since
            if gone_s >= self._no_workers_grace_s:
                error = NoAgentsError(f"{NO_WORKERS} (none for {gone_s:.0f} s)")
                for flight in flights:
                    # Its message stays queued: an agents worker started later must drop it, as
                    # the caller runs the conversation elsewhere. One that started meanwhile
                    # goes on, and is waited for.
                    abandoned = await self._store.supersede(
                        flight.run_id, ABANDONED, flight.seen_attempts
                    )
                    if abandoned and not flight.answer.done():
                        flight.answer.set_exception(error)
            return
        # Sent before a worker died (which may have taken it), or long enough ago.
        late = [
            f
            for f in flights
            if f.sent_at < self._worker_lost_at or now - f.sent_at > self._lost_after_s
        ]
        if not late:
            return
        depth = await read_queue_depths(self._settings, [AGENTS_QUEUE])
        backlog_s = self._settings.conversation_timeout_s + self._settings.reply_margin_s
        for flight in late:
            waited = now - flight.sent_at
            # With nothing queued, a send not started went to a worker that never ran it; with
            # a backlog, only one older than a whole conversation's time is taken for lost.
            if depth.get(AGENTS_QUEUE, 0) == 0 or waited > backlog_s:
                why = f"no agents worker started it in {waited:.0f} s"
                await self._send_again(flight, flight.seen_attempts, why)

    @staticmethod
    def _failed(
        flight: _Flight, holder: str | None, attempts: int, why: str, now: float
    ) -> dict[str, Any]:
        ran_on = _worker_of(holder) if holder else None
        error = f"no answer from the agents pool: {why}"
        return flight.failed(error, attempts, ran_on, now - flight.sent_at)


def _resolve(flight: _Flight, record: dict[str, Any]) -> None:
    if not flight.answer.done():
        flight.answer.set_result(record)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _worker_of(holder: str | None) -> str:
    return holder.split(" ", 1)[1] if holder and " " in holder else "unknown"
