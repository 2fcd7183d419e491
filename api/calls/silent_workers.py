"""Calls whose worker died mid-call, answered within seconds rather than at their deadline.

A worker names itself (its Celery node name) in the start marker of each call it begins
(``start_mark``), and announces itself every ``HEARTBEAT_INTERVAL_S`` with a key that lapses
``HEARTBEAT_TTL_S`` after its last beat. A call whose worker's key has lapsed, and stays lapsed
for another heartbeat interval (a result store that restarted empty is announced to again by
then), started on a worker that is gone: it is answered ``interrupted``, outcome unknown, the
answer a dead worker's call gets at its deadline, without the wait.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import redis.asyncio as aioredis

from worker.contract.keys import keys
from worker.contract.wire import (
    CALLER_GAVE_UP,
    POOLS,
    ToolCallResult,
    read_start_mark,
    start_mark_node,
)
from worker.plumbing.heartbeat import HEARTBEAT_INTERVAL_S, HEARTBEAT_TTL_S

if TYPE_CHECKING:
    from api.calls.call_watch import InFlight

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SilentWorkers:
    """Answers the started calls of workers that stopped announcing themselves."""

    redis: aioredis.Redis
    #: How long a lapsed heartbeat must stay lapsed before its worker is taken for dead.
    patience_s: float = HEARTBEAT_INTERVAL_S
    clock: Callable[[], float] = time.monotonic
    #: When each call's worker was first found silent.
    _silent_since: dict[str, float] = field(default_factory=dict, init=False)

    async def answer(self, started: Sequence[tuple[InFlight, bytes | str]]) -> None:
        """Of ``started`` (calls in flight, each with its start marker), answer those whose
        worker has been silent long enough."""
        named = [
            (flight, mark, node)
            for flight, mark in started
            if (node := start_mark_node(mark)) is not None
            and read_start_mark(mark)[0] != CALLER_GAVE_UP
        ]
        nodes = sorted({node for _, _, node in named})
        alive = await self._alive(nodes)
        now = self.clock()
        silent_since: dict[str, float] = {}
        for flight, mark, node in named:
            task_id = flight.request.task_id
            if node in alive or flight.answer.done():
                continue
            since = silent_since[task_id] = self._silent_since.get(task_id, now)
            if now - since < self.patience_s:
                continue
            del silent_since[task_id]
            log.warning(
                "call %s: worker %s started it and no longer announces itself: answered "
                "interrupted",
                task_id,
                node,
            )
            flight.answer.set_result(self.interrupted(flight, mark, node))
        self._silent_since = silent_since

    async def _alive(self, nodes: list[str]) -> set[str]:
        """The workers of ``nodes`` that announce themselves in any pool."""
        if not nodes:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for node in nodes:
                pipe.exists(*(keys.worker_heartbeat(pool, node) for pool in POOLS))
            counts = await pipe.execute()
        return {node for node, count in zip(nodes, counts, strict=True) if count}

    @staticmethod
    def interrupted(flight: InFlight, mark: bytes | str, node: str) -> ToolCallResult:
        request = flight.request
        _, process = read_start_mark(mark)
        lapsed = HEARTBEAT_TTL_S / HEARTBEAT_INTERVAL_S
        return ToolCallResult.failure(
            request,
            "interrupted",
            f"Error: {request.tool} was interrupted: worker {node} ({process}) started it and "
            f"stopped announcing itself (no heartbeat in {lapsed:.0f} intervals: it died, or "
            "lost its result store); its outcome is unknown.",
        )
