"""A caller's reply list: runners push answers to one Redis list per caller, and one reader drains
it, handing each answer to whoever waits for its job.

However many jobs are in flight, their answers cost one connection and one task.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Generic, Protocol, TypeVar, cast

import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.exceptions import RedisError, ResponseError

from worker.plumbing.backoff import Backoff

log = logging.getLogger(__name__)
_DRAIN_BATCH = 512
#: The pause before trying the broker or the result store again after failures in a row: short
#: enough that a blink costs little, growing so that an outage is not hammered.
RECONNECT = Backoff(first_s=0.1, cap_s=2.0)
#: How long stopping waits for the reader to see it is closing.
_STOP_WAIT_S = 2.0


class Waiter(Protocol):
    """Whoever waits for a job's answer."""

    @property
    def answer(self) -> asyncio.Future[Any]: ...


AnswerT = TypeVar("AnswerT", bound=BaseModel)
WaiterT = TypeVar("WaiterT", bound=Waiter)


@dataclass(eq=False)
class ReplyReader(Generic[AnswerT, WaiterT]):
    """Reads the answers pushed to ``key`` as ``answer_type`` and hands each to ``accept`` with
    the waiter that ``waiting`` holds for its job (``job_of``); an answer nobody waits for any
    more is dropped. A malformed answer is dropped too, and told to ``malformed``."""

    client: aioredis.Redis
    key: str
    answer_type: type[AnswerT]
    waiting: Mapping[str, WaiterT]
    job_of: Callable[[AnswerT], str]
    accept: Callable[[WaiterT, AnswerT], None]
    _: KW_ONLY
    malformed: Callable[[bytes | str], None] | None = None
    _task: asyncio.Task[None] | None = field(default=None, init=False)
    _closing: bool = field(default=False, init=False)

    @property
    def started(self) -> bool:
        return self._task is not None

    def start(self, name: str) -> None:
        """Start reading, in a task named ``name``, unless reading already."""
        if self._task is None:
            self._task = asyncio.create_task(self._read(), name=name)

    async def stop(self) -> None:
        """Stop reading, closing the client's connections: a blocking BLMPOP does not answer a
        cancel promptly in redis.asyncio, while a closed connection ends it at once."""
        self._closing = True
        task, self._task = self._task, None
        with contextlib.suppress(RedisError, OSError):
            await self.client.connection_pool.disconnect(inuse_connections=True)
        if task is not None:
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(task, _STOP_WAIT_S)

    def deliver(self, raw: bytes | str) -> None:
        try:
            answer = self.answer_type.model_validate_json(raw)
        except ValueError:
            log.warning("dropping a malformed answer from %s: %.200r", self.key, raw)
            if self.malformed is not None:
                self.malformed(raw)
            return
        waiter = self.waiting.get(self.job_of(answer))
        if waiter is None or waiter.answer.done():
            return  # a late answer to a job its caller gave up on
        self.accept(waiter, answer)

    async def _read(self) -> None:
        await read_replies(
            self.client,
            self.key,
            self.deliver,
            others_waiting=lambda: len(self.waiting) > 1,
            closing=lambda: self._closing,
        )


async def read_replies(
    client: aioredis.Redis,
    key: str,
    deliver: Callable[[bytes | str], None],
    *,
    others_waiting: Callable[[], bool],
    closing: Callable[[], bool],
) -> None:
    """Hand every answer pushed to ``key`` to ``deliver`` until ``closing()``.

    On Redis 7 and later one BLMPOP per round takes every answer waiting, or waits for the
    next: one command however many came back together. Before that, BLPOP waits for one and,
    while another answer is awaited, LPOPs take what arrives next without blocking."""
    failures = 0
    blmpop = True
    draining = False
    batch: list[bytes | str]
    while not closing():
        try:
            if blmpop:
                found = await client.blmpop(1, 1, key, direction="LEFT", count=_DRAIN_BATCH)
                batch = [] if found is None else cast(list[bytes | str], found[1])
            elif draining:
                # Answers are coming back one after another: take all that arrived since the
                # last round trip, without blocking; only an empty list sends the reader back
                # to waiting.
                batch = await client.lpop(key, _DRAIN_BATCH) or []  # type: ignore[assignment]
            else:
                item = await client.blpop([key], timeout=1)
                batch = [] if item is None else [item[1]]
            for raw in batch:
                deliver(raw)
            # Look again at once only while another answer is awaited (those just delivered
            # are still listed): a lone job would pay for an empty LPOP every time.
            draining = bool(batch) and others_waiting()
            failures = 0
        except (RedisError, OSError) as exc:
            if blmpop and isinstance(exc, ResponseError) and "unknown command" in str(exc).lower():
                blmpop = False  # Redis before 7
                continue
            if closing():
                return
            # The result store restarted or the network blinked: keep trying; what still waits
            # falls back to its deadline and to the stored answer.
            failures += 1
            delay = RECONNECT.delay(failures)
            log.warning("reply reader: %s; retrying in %.1fs", exc, delay)
            await asyncio.sleep(delay)
