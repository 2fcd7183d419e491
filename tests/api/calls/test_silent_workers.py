"""Which started calls the caller answers ``interrupted`` for their worker's silence, on a real
Redis and a clock of the test's own: only once the worker's heartbeat has lapsed and stayed
lapsed a heartbeat interval more; a worker that announces itself again (a store that restarted
empty) keeps its calls; a caller's own mark, or one naming no worker, is never taken for one."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import pytest
import redis.asyncio as aioredis

from api.calls.call_watch import InFlight
from api.calls.silent_workers import SilentWorkers
from tests.conftest import RedisServer
from worker.contract.keys import keys
from worker.contract.wire import CALLER_GAVE_UP, ToolCallRequest, start_mark
from worker.plumbing.heartbeat import HEARTBEAT_INTERVAL_S

pytestmark = pytest.mark.integration

NODE = "sandbox-ab12cd@host"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
async def client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    made = aioredis.Redis.from_url(redis_server.url)
    yield made
    await made.aclose()


def flight(task_id: str) -> InFlight:
    request = ToolCallRequest(
        task_id=task_id,
        run_id="run-silent",
        tool="run_bash",
        arguments={"command": "sleep 60"},
        timeout_ms=60_000,
        deadline=time.time() + 76,
    )
    return InFlight(request, "sandbox", asyncio.get_running_loop().create_future())


async def test_a_call_is_answered_only_after_its_worker_stays_silent(
    client: aioredis.Redis,
) -> None:
    clock = Clock()
    watch = SilentWorkers(client, clock=clock)
    beat = keys.worker_heartbeat("sandbox", NODE)
    await client.set(beat, "{}", ex=60)
    call = flight("call-1")
    started = [(call, start_mark(1, "host:41", NODE).encode())]
    await watch.answer(started)
    assert not call.answer.done()  # it announces itself
    await client.delete(beat)  # lapsed, or the store restarted empty
    await watch.answer(started)
    clock.now += HEARTBEAT_INTERVAL_S / 2
    await watch.answer(started)
    assert not call.answer.done()  # not silent for a whole interval yet
    await client.set(beat, "{}", ex=60)  # it beat again: it lives
    clock.now += HEARTBEAT_INTERVAL_S
    await watch.answer(started)
    await client.delete(beat)
    clock.now += HEARTBEAT_INTERVAL_S / 2
    await watch.answer(started)
    assert not call.answer.done()  # silence counts from when it was seen again
    clock.now += HEARTBEAT_INTERVAL_S
    await watch.answer(started)
    result = call.answer.result()
    assert result.error_kind == "interrupted" and "outcome is unknown" in result.output
    assert f"worker {NODE} (host:41)" in result.output


async def test_marks_naming_no_worker_are_left_to_the_deadline(client: aioredis.Redis) -> None:
    clock = Clock()
    watch = SilentWorkers(client, clock=clock)
    older, caller = flight("call-old"), flight("call-caller")
    started = [
        (older, b"1 host:41"),  # written before marks named their worker
        (caller, start_mark(CALLER_GAVE_UP, "caller:me").encode()),
    ]
    for _ in range(3):
        await watch.answer(started)
        clock.now += HEARTBEAT_INTERVAL_S * 2
    assert not older.answer.done() and not caller.answer.done()
