"""Hundreds of calls waiting at once on a fleet that never answers them, as on an overloaded
machine: each is answered at its deadline as the delivery docs say, none with a connection
pool's error, and the caller goes on working. Real Redis, a database no worker consumes."""

from __future__ import annotations

import asyncio
import time
import uuid
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from api.calls.call_watch import CallWatch, InFlight
from api.calls.dispatch import Dispatcher
from tests.api.calls.test_call_watch import answer_as_worker, queued_requests
from tests.conftest import RedisServer, tool_spec, unconsumed_settings, until
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallRequest, start_mark

pytestmark = pytest.mark.integration

CALLS = 300
#: The connections the callers below may hold: far fewer than the calls.
CONNECTIONS = 2
WRITE = tool_spec("write_file")


@pytest.fixture
def settings(redis_server: RedisServer, tmp_path: Path) -> WorkerSettings:
    return unconsumed_settings(redis_server, tmp_path, resend_after_s=0.5)


async def test_calls_past_their_deadline_together_are_answered_over_a_small_pool(
    settings: WorkerSettings,
) -> None:
    """A pool that refuses a third connection: the old way, one read per call, answered most
    calls "cannot be read"; read together, every call gets its true last word."""
    store = aioredis.Redis(
        connection_pool=aioredis.ConnectionPool.from_url(
            settings.redis_url, max_connections=CONNECTIONS
        )
    )
    client = redis.Redis.from_url(settings.redis_url)
    watch = CallWatch(store, settings, {}, lambda _: None, "c1")
    flights = []
    for n in range(CALLS):
        request = ToolCallRequest(
            task_id=f"due-{n}-{uuid.uuid4().hex}",
            run_id="run-1",
            tool="write_file",
            arguments={},
            timeout_ms=1000,
            deadline=time.time(),
            reply_to="toolq:reply:c1",
        )
        flights.append(InFlight(request, "tools", asyncio.get_running_loop().create_future()))
    # A third started on a worker that stopped and never answers.
    for flight in flights[::3]:
        client.set(keys.started(flight.request.task_id), start_mark(1, "tools-host:7"))
    try:
        answers = await asyncio.gather(*(watch.last_word(flight, 4.0) for flight in flights))
    finally:
        await store.aclose()
    for n, answer in enumerate(answers):
        if n % 3 == 0:
            assert answer.error_kind == "interrupted", answer.output
            assert "worker tools-host:7 started it" in answer.output
        else:
            assert answer.error_kind == "no_answer", answer.output
            assert "never started, and will not start now" in answer.output


async def test_hundreds_of_unanswered_calls_get_their_deadline_answer_and_the_caller_works_on(
    settings: WorkerSettings,
) -> None:
    client = redis.Redis.from_url(settings.redis_url)
    async with Dispatcher(settings, redis_connections=CONNECTIONS) as dispatcher:
        requests = [
            dispatcher.build_request(
                WRITE,
                task_id=f"waits-{n}-{uuid.uuid4().hex}",
                run_id="run-1",
                arguments={"path": f"f{n}.txt", "content": "x"},
                timeout_ms=1000,
            )
            for n in range(CALLS)
        ]
        answers = await asyncio.gather(*(dispatcher.call(r, "tools") for r in requests))
        assert [a.error_kind for a in answers] == ["no_answer"] * CALLS
        assert all("no worker is serving the 'tools' queue" in a.output for a in answers)
        # The caller keeps working: a call a worker answers now is answered.
        client.delete("tools")
        request = dispatcher.build_request(
            WRITE,
            task_id=f"after-{uuid.uuid4().hex}",
            run_id="run-1",
            arguments={"path": "after.txt", "content": "done"},
            timeout_ms=10_000,
        )
        pending = asyncio.create_task(dispatcher.call(request, "tools"))
        await until(lambda: len(queued_requests(client)) >= 1, "the call to be queued")
        answer_as_worker(settings, client, queued_requests(client)[0])
        answer = await asyncio.wait_for(pending, 30)
    assert answer.error_kind is None, answer.output
    assert answer.output == "Wrote 4 bytes to after.txt."
