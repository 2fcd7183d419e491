"""A run's pin to the worker holding its shell sessions: learnt from a bash_session answer, where
its sandbox calls go while that worker lives, and what its caller hears once it is gone."""

from __future__ import annotations

import time
from typing import Any

import fakeredis.aioredis
import pytest

from api.calls.session_pins import MAX_RUNS, SessionPins
from worker.contract.keys import keys
from worker.contract.wire import ToolCallRequest, ToolCallResult
from worker.images.owner import pinned_queue

WORKER = "sandbox-1a2b3c@host"
QUEUE = pinned_queue(WORKER)


def request(tool: str = "bash_session", run_id: str = "run-1", **arguments: Any) -> ToolCallRequest:
    return ToolCallRequest(
        task_id=f"{run_id}.{time.monotonic_ns()}",
        run_id=run_id,
        tool=tool,
        arguments=arguments or {"action": "read"},
        timeout_ms=1000,
        deadline=time.time() + 30,
    )


def answered(call: ToolCallRequest, holder: str | None = QUEUE) -> ToolCallResult:
    return ToolCallResult(task_id=call.task_id, tool=call.tool, output="{}", holder=holder)


@pytest.fixture
async def redis() -> fakeredis.aioredis.FakeRedis:
    client = fakeredis.aioredis.FakeRedis()
    await client.set(keys.worker_heartbeat("sandbox", WORKER), "{}")
    return client


@pytest.fixture
def pins() -> SessionPins:
    """Run ``run-1``, whose sessions WORKER holds."""
    pins = SessionPins()
    first = request()
    pins.settle(first, "sandbox", answered(first))
    return pins


async def test_a_runs_sandbox_calls_go_to_its_sessions_worker(
    pins: SessionPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    for call in (request(), request("run_bash", command="true")):
        placed = await pins.place(call, "sandbox", redis)
        assert placed == (call, QUEUE)
    tools_call = request("read_file", path="a")
    assert await pins.place(tools_call, "tools", redis) == (tools_call, "tools")
    other_run = request(run_id="run-2")
    assert await pins.place(other_run, "sandbox", redis) == (other_run, "sandbox")


async def test_once_its_worker_is_gone_a_session_call_answers_session_lost(
    pins: SessionPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    await redis.delete(keys.worker_heartbeat("sandbox", WORKER))

    lost = await pins.place(request(action="type_submit", input="ls"), "sandbox", redis)
    again = await pins.place(request(), "sandbox", redis)
    command = request("run_bash", command="true")
    elsewhere = await pins.place(command, "sandbox", redis)

    for answer in (lost, again):
        assert isinstance(answer, ToolCallResult) and answer.error_kind == "session_lost"
        assert WORKER in answer.output and "restart" in answer.output
    assert elsewhere == (command, "sandbox")  # a command needs no shell of the old worker's
    restart = request(action="restart")
    assert await pins.place(restart, "sandbox", redis) == (restart, "sandbox")
    assert pins.holder("run-1") is None


async def test_a_session_lost_answer_from_a_worker_marks_the_run_lost(
    pins: SessionPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    call = request()
    pins.settle(
        call, QUEUE, ToolCallResult.failure(call, "session_lost", "Error: session lost: ...")
    )

    assert isinstance(await pins.place(request(), "sandbox", redis), ToolCallResult)


def test_the_least_recently_used_runs_are_forgotten_past_the_bound() -> None:
    pins = SessionPins()
    for number in range(MAX_RUNS + 1):
        call = request(run_id=f"run-{number}")
        pins.settle(call, "sandbox", answered(call))

    assert pins.holder("run-0") is None
    assert pins.holder(f"run-{MAX_RUNS}") == QUEUE


async def test_a_session_call_its_holders_worker_never_took_answers_session_lost(
    pins: SessionPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    call = request(action="type_submit", input="ls")
    unanswered = ToolCallResult.failure(call, "no_answer", "Error: no answer ...")

    settled = pins.settle(call, QUEUE, unanswered)

    assert settled.error_kind == "session_lost" and "restart" in settled.output
    assert isinstance(await pins.place(request(), "sandbox", redis), ToolCallResult)
