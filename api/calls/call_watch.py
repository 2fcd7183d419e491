"""What becomes of the tool calls a caller waits for, read from the result store: an answer
taken only when it is the call's own, a call lost before any worker started it sent again, and,
at a call's deadline, a true account of it.

A call's start marker (``keys.started``) decides. A worker sets it as the call begins, so a call
without one never started. At the deadline the caller sets it itself where no worker has: the
call then never starts (a late message of it finds the caller's mark and is dropped), and
``no_answer`` is the truth. A call that started and never answered may have run: it is
``interrupted``, its outcome unknown. When the marker cannot be read, nothing is known, and the
answer says so rather than claim the call did not run.

An answer is the call's own when it is sealed with the call's key, derived from the fleet secret
and the call's id (``worker.contract.fleet_secret``), which is in no message: anyone who can
write to Redis can push text to a caller's reply list or put it at a call's result key, and none
of it is taken for an answer. An answer sealed under another fleet secret is refused too, and
the call's last word says so, naming the setting.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.calls.fleet import read_queue_depths
from api.calls.silent_workers import SilentWorkers
from worker.contract.fleet_secret import SECRET_SETTING, FleetSecret, fleet_secret
from worker.contract.keys import keys
from worker.contract.settings import FleetSettings
from worker.contract.wire import (
    CALLER_GAVE_UP,
    ToolCallRequest,
    ToolCallResult,
    read_start_mark,
    start_mark,
)

log = logging.getLogger(__name__)
#: The calls a log line of calls sent again names; it counts the rest.
SHOWN_TASK_IDS = 5


@dataclass(slots=True)
class InFlight:
    """A call its caller waits for."""

    #: The message of the call sent last (``send_number`` counts them).
    request: ToolCallRequest
    pool: str
    answer: asyncio.Future[ToolCallResult]
    #: When that message went out (monotonic); None until it has. Set by the sending thread.
    sent_at: float | None = None
    #: A value not the call's own was found at its result key: reported once.
    saw_foreign_result: bool = False
    #: An answer came sealed under another fleet secret (its ``sealer``).
    foreign_sealer: str | None = None


@dataclass(eq=False)
class CallWatch:
    """Looks at the calls in flight every half ``resend_after_s``, and gives each its last word.

    ``send_again`` sends the next message of a call; ``caller`` names this caller in the start
    marker it sets at a deadline."""

    redis: aioredis.Redis
    settings: FleetSettings
    in_flight: Mapping[str, InFlight]
    send_again: Callable[[InFlight], None]
    caller: str
    #: Answers refused because they were not the call's own (forged, or malformed).
    refused: int = field(default=0, init=False)
    #: What seals the answers of this caller's calls (``TOOLQ_FLEET_SECRET_FILE``).
    secret: FleetSecret = field(init=False)
    #: Answers the started calls of workers that died (``api.calls.silent_workers``).
    silent_workers: SilentWorkers = field(init=False)
    #: Calls whose deadline passed, each with how long it waited, for their last word.
    _due_words: list[tuple[InFlight, float, asyncio.Future[ToolCallResult]]] = field(
        default_factory=list, init=False
    )
    _words_task: asyncio.Task[None] | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self.silent_workers = SilentWorkers(self.redis)
        self.secret = fleet_secret(self.settings.fleet_secret_file)

    def is_own(self, result: ToolCallResult, flight: InFlight) -> bool:
        """Whether ``result`` is the answer to ``flight``'s call, sealed by a worker of this
        fleet; one sealed under another fleet secret is noted for the call's last word."""
        task_id = flight.request.task_id
        if result.task_id == task_id and result.is_sealed_with(self.secret.seal_key(task_id)):
            return True
        if result.sealer and result.sealer != self.secret.secret_id:
            if flight.foreign_sealer is None:
                log.warning(
                    "call %s: an answer came sealed under another fleet secret (%s; this "
                    "caller's is %s, from %s): the workers and this caller must read the same "
                    "%s",
                    task_id,
                    result.sealer,
                    self.secret.secret_id,
                    self.secret.path,
                    SECRET_SETTING,
                )
            flight.foreign_sealer = result.sealer
        return False

    def refuse(self, task_id: str, what: str) -> None:
        """Count and report an answer to ``task_id`` that is not its own; the call waits on."""
        self.refused += 1
        log.warning(
            "call %s: refused %s that is not its own (not sealed with the call's key); "
            "still waiting for its answer",
            task_id,
            what,
        )

    def own_answer(self, raw: bytes | str | None, flight: InFlight) -> ToolCallResult | None:
        """The result stored as ``raw`` when it is the call's own; one that is not is reported
        (once per call: the worker replaces it when the call runs)."""
        if raw is None:
            return None
        request = flight.request
        try:
            result = ToolCallResult.model_validate_json(raw)
        except ValueError:
            result = None
        if result is not None and self.is_own(result, flight):
            return result
        if not flight.saw_foreign_result:
            flight.saw_foreign_result = True
            self.refuse(request.task_id, "a stored result")
        return None

    async def watch(self, closing: Callable[[], bool]) -> None:
        """Look at the calls in flight until ``closing()``."""
        while not closing():
            await asyncio.sleep(self.settings.resend_after_s / 2)
            try:
                await self.look()
            except (RedisError, OSError) as exc:
                log.warning("cannot look at the tool calls in flight: %s", exc)

    async def look(self) -> None:
        """Take the stored answers of calls whose reply did not come, and send again the calls
        no worker has started a while after their last message went out (``resend_pause``)
        while their pool's queue is empty: their message was lost (a broker restart, a worker
        gone with it)."""
        now = time.monotonic()
        due = [
            flight
            for flight in self.in_flight.values()
            if not flight.answer.done()
            and flight.sent_at is not None
            and now - flight.sent_at >= resend_pause(self.settings, flight.request.send_number)
        ]
        if not due:
            return
        # Two commands however many calls are due (under load, most of them still wait in
        # their queue): their stored answers, and their start markers.
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.mget([keys.result(flight.request.task_id) for flight in due])
            pipe.mget([keys.started(flight.request.task_id) for flight in due])
            stored, marks = await pipe.execute()
        unstarted: list[InFlight] = []
        started: list[tuple[InFlight, bytes]] = []
        for flight, raw, mark in zip(due, stored, marks, strict=True):
            answer = self.own_answer(raw, flight)
            if answer is not None:
                if not flight.answer.done():
                    flight.answer.set_result(answer)
            elif mark is None:
                unstarted.append(flight)
            else:
                started.append((flight, mark))
        await self.silent_workers.answer(started)
        if unstarted:
            await self._send_lost(unstarted)

    async def _send_lost(self, unstarted: list[InFlight]) -> None:
        # With messages queued, a call not started may be one of them: only an empty queue
        # says it is not waiting. A queue that cannot be read sends nothing now.
        pools = sorted({flight.pool for flight in unstarted})
        try:
            depths = await read_queue_depths(self.settings, pools)
        except Exception as exc:  # any broker's own errors: look again next time
            log.warning("cannot read the depth of the %s queues: %s", ", ".join(pools), exc)
            return
        now = time.monotonic()
        sent_again: dict[str, list[str]] = {}
        for flight in unstarted:
            left = flight.request.deadline - time.time()
            if flight.answer.done() or left < self.settings.resend_after_s:
                # Answered, or given up on, while the depths were read; or too little time
                # is left for a worker to take a message and answer before the caller stops
                # waiting.
                continue
            # Past half of the time its last message had left, still not started: sent again
            # whatever the queue holds (a backlog then grows by a few messages per call at
            # most, halving the time left each), so that a message lost behind a queue that
            # never empties, and each one sent after it, still runs in time.
            assert flight.sent_at is not None
            late = now - flight.sent_at >= left
            if depths.get(flight.pool, 0) == 0 or late:
                self.send_again(flight)
                sent_again.setdefault(flight.pool, []).append(flight.request.task_id)
        # A line per pool and look, not per call: a broker that lost a thousand messages would
        # otherwise bury the log (and fill a pipe nobody reads).
        for pool, task_ids in sent_again.items():
            more = len(task_ids) - SHOWN_TASK_IDS
            log.info(
                "sent %d call(s) again that no worker started, the %r queue empty or half "
                "their time gone: %s%s",
                len(task_ids),
                pool,
                ", ".join(task_ids[:SHOWN_TASK_IDS]),
                f" and {more} more" if more > 0 else "",
            )

    async def last_word(self, flight: InFlight, waited: float) -> ToolCallResult:
        """The answer to a call whose deadline passed without one: its stored answer, else what
        is true of it: it may have run (``interrupted``) or never will (``no_answer``).

        Calls whose deadlines pass together are read together, in one transaction whatever
        their number: hundreds of calls given up on at once hold one connection for one round
        trip, not one connection each (a pool's bound would refuse them)."""
        word: asyncio.Future[ToolCallResult] = asyncio.get_running_loop().create_future()
        self._due_words.append((flight, waited, word))
        if self._words_task is None or self._words_task.done():
            self._words_task = asyncio.create_task(self._say_last_words(), name="toolq-last-words")
        return await word

    async def _say_last_words(self) -> None:
        """Answer the calls waiting for their last word, a transaction per round: calls whose
        deadline passes during one round are read in the next."""
        while self._due_words:
            due, self._due_words = self._due_words, []
            try:
                words = await self._last_words([(flight, waited) for flight, waited, _ in due])
            except BaseException as exc:  # the callers hear of it rather than wait for ever
                for _, _, word in due:
                    if not word.done():
                        word.set_exception(exc)
                if isinstance(exc, asyncio.CancelledError):
                    raise
                continue
            for (_, _, word), answer in zip(due, words, strict=True):
                if not word.done():  # its caller may have been cancelled meanwhile
                    word.set_result(answer)

    async def _last_words(self, due: list[tuple[InFlight, float]]) -> list[ToolCallResult]:
        try:
            # One transaction: a worker that starts one of the calls now finds the caller's
            # mark, and one that started it before is found.
            async with self.redis.pipeline(transaction=True) as pipe:
                for flight, _ in due:
                    task_id = flight.request.task_id
                    pipe.get(keys.result(task_id))
                    pipe.set(
                        keys.started(task_id),
                        start_mark(CALLER_GAVE_UP, f"caller:{self.caller}"),
                        nx=True,
                        ex=self.settings.result_ttl_s,
                    )
                    pipe.get(keys.started(task_id))
                replies = await pipe.execute()
        except (RedisError, OSError) as exc:
            return [_unreadable(flight.request, waited, exc) for flight, waited in due]
        read = [replies[i : i + 3] for i in range(0, len(replies), 3)]
        # Why the calls that never started did not: one look per pool, not per call.
        pools = sorted(
            {flight.pool for (flight, _), (_, claimed, _) in zip(due, read, strict=True) if claimed}
        )
        whys = {pool: await self._not_started_why(pool) for pool in pools}
        return [
            self._word(flight, waited, stored, claimed, mark, whys)
            for (flight, waited), (stored, claimed, mark) in zip(due, read, strict=True)
        ]

    def _word(
        self,
        flight: InFlight,
        waited: float,
        stored: bytes | None,
        claimed: bool | None,
        mark: bytes | None,
        whys: Mapping[str, str],
    ) -> ToolCallResult:
        """A call's last word from what its keys held at its deadline."""
        request = flight.request
        tool = request.tool
        answer = self.own_answer(stored, flight)
        if answer is not None:
            return answer
        if not claimed:
            _, starter = read_start_mark(mark or b"")
            return ToolCallResult.failure(
                request,
                "interrupted",
                f"Error: {tool} was interrupted: worker {starter} started it and no answer "
                f"came in {waited:.1f} s (the worker may have died, or its answer was lost); "
                f"its outcome is unknown.{self._foreign_note(flight)}",
            )
        return ToolCallResult.failure(
            request,
            "no_answer",
            f"Error: no answer for {tool} after {waited:.1f} s: {whys[flight.pool]}. It never "
            "started, and will not start now.",
        )

    def _foreign_note(self, flight: InFlight) -> str:
        """What the call's last word adds when answers came sealed under another secret."""
        if flight.foreign_sealer is None:
            return ""
        return (
            f" Its answer came sealed under another fleet secret ({flight.foreign_sealer}; "
            f"this caller's is {self.secret.secret_id}, from {self.secret.path}) and was "
            f"refused: the workers and this caller must read the same {SECRET_SETTING}."
        )

    async def _not_started_why(self, pool: str) -> str:
        try:
            workers = [k async for k in self.redis.scan_iter(keys.worker_heartbeats(pool))]
        except (RedisError, OSError) as exc:
            return f"the result store became unreachable ({exc})"
        if not workers:
            # Heartbeats are refreshed every few seconds: right after a broker restart live
            # workers have none yet, so say both.
            return (
                f"no worker is serving the {pool!r} queue (none has announced itself: none "
                "runs, or the broker restarted moments ago)"
            )
        return f"none of the {len(workers)} live {pool!r} workers took it in time"


def _unreadable(request: ToolCallRequest, waited: float, exc: Exception) -> ToolCallResult:
    return ToolCallResult.failure(
        request,
        "interrupted",
        f"Error: {request.tool} may have been interrupted: no answer came in {waited:.1f} s, "
        f"and whether it started cannot be read (the result store is unreachable: {exc}); "
        "its outcome is unknown.",
    )


#: The pause before a call is sent again doubles this many times at most (to 4 times
#: ``resend_after_s``).
_MOST_DOUBLINGS = 2


def resend_pause(settings: FleetSettings, send_number: int) -> float:
    """How long after message ``send_number`` of a call went out, not started, it is taken
    for lost: ``resend_after_s``, doubled for each message sent before it, up to a bound. A
    broker that restarts again and again loses a call only when it loses every one of its
    messages."""
    doublings = min(send_number - 1, _MOST_DOUBLINGS)
    return settings.resend_after_s * (1 << doublings)
