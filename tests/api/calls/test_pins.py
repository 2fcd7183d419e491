"""A run's pin to the worker holding its container: where its sandbox calls go, and what its
caller hears when that worker is gone."""

from __future__ import annotations

import time

import fakeredis.aioredis
import pytest

from api.calls.pins import RECREATED_NOTICE, Pin, RunPins
from worker.contract.keys import keys
from worker.contract.wire import ToolCallRequest, ToolCallResult
from worker.images.owner import pinned_queue, pool_of_queue

WORKER = "sandbox-1a2b3c@host"


def request(run_id: str = "run-1", tool: str = "run_bash") -> ToolCallRequest:
    return ToolCallRequest(
        task_id=f"{run_id}.call",
        run_id=run_id,
        tool=tool,
        arguments={"command": "true"},
        timeout_ms=1000,
        deadline=time.time() + 30,
    )


def pin(restart: object = None) -> Pin:
    return Pin(
        run_id="run-1",
        environment="toolq-abc",
        worker=WORKER,
        queue=pinned_queue(WORKER),
        image="python:3.12-slim",
        digest="sha256:" + "0" * 64,
        restart=restart,  # type: ignore[arg-type]
    )


@pytest.fixture
async def redis() -> fakeredis.aioredis.FakeRedis:
    return fakeredis.aioredis.FakeRedis()


@pytest.fixture
def pins() -> RunPins:
    """Run ``run-1`` pinned to the container WORKER holds."""
    pins = RunPins()
    pins.pin(pin())
    return pins


async def placed_while_live(
    pins: RunPins, redis: fakeredis.aioredis.FakeRedis
) -> tuple[ToolCallRequest, str]:
    """A sandbox call of ``run-1`` placed while WORKER is live: what is sent, and where."""
    await redis.set(keys.worker_heartbeat("sandbox", WORKER), "{}")
    placed = await pins.place(request(), "sandbox", redis)
    assert not isinstance(placed, ToolCallResult)
    return placed


async def test_a_pinned_runs_sandbox_calls_go_to_its_workers_queue(
    pins: RunPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    sent, queue = await placed_while_live(pins, redis)
    assert queue == "sandbox.sandbox-1a2b3c@host" and sent.environment == "toolq-abc"
    assert pool_of_queue(queue) == "sandbox"
    # Its tools pool calls, and other runs' calls, go as they are.
    read = request(tool="read_file")
    assert await pins.place(read, "tools", redis) == (read, "tools")
    other = request("run-2")
    assert await pins.place(other, "sandbox", redis) == (other, "sandbox")


async def test_a_gone_worker_is_environment_lost_at_once(
    pins: RunPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    sent: list[str] = []

    async def send(req: ToolCallRequest, queue: str) -> ToolCallResult:
        sent.append(queue)
        raise AssertionError("nothing is sent to a worker that is gone")

    answer = await pins.call(request(), "sandbox", send, redis)
    assert answer.error_kind == "environment_lost" and sent == []
    assert answer.output.startswith("Error: environment lost: the container of run run-1")
    assert "python:3.12-slim" in answer.output and WORKER in answer.output


async def test_a_run_that_allows_it_is_sent_to_its_container_started_again(
    redis: fakeredis.aioredis.FakeRedis,
) -> None:
    fresh_worker = "sandbox-4d5e6f@host"
    await redis.set(keys.worker_heartbeat("sandbox", fresh_worker), "{}")

    async def restart() -> Pin:
        return Pin("run-1", "toolq-abc", fresh_worker, pinned_queue(fresh_worker), "i", "d")

    pins = RunPins()
    pins.pin(pin(restart))
    sent: list[tuple[str, str]] = []

    async def send(req: ToolCallRequest, queue: str) -> ToolCallResult:
        sent.append((req.task_id, queue))
        return ToolCallResult(task_id=req.task_id, tool=req.tool, output="ran")

    answer = await pins.call(request(), "sandbox", send, redis)
    # The model is told first that what was outside the workspace is gone, then the answer.
    assert answer.output == RECREATED_NOTICE.format(image=repr("i")) + "\nran"
    # A new id: the lost call's answer is stored under the old one.
    assert sent == [("run-1.call.r", pinned_queue(fresh_worker))]


async def test_a_call_no_worker_took_says_environment_lost(
    pins: RunPins, redis: fakeredis.aioredis.FakeRedis
) -> None:
    sent, _ = await placed_while_live(pins, redis)
    unanswered = ToolCallResult.failure(sent, "no_answer", "Error: no worker took it")
    settled = pins.settle(sent, unanswered)
    assert settled.error_kind == "environment_lost"
    assert "its worker stopped" in settled.output


async def test_whether_a_lost_call_is_sent_again_is_decided_by_its_answers_kind(
    redis: fakeredis.aioredis.FakeRedis,
) -> None:
    """A call no worker took by its deadline is not sent again; one its container's worker
    answered ``environment_lost`` is, to the container started again, whatever text either
    answer ends with (a worker's words can end like the caller's own)."""
    await redis.set(keys.worker_heartbeat("sandbox", WORKER), "{}")
    fresh_worker = "sandbox-4d5e6f@host"
    await redis.set(keys.worker_heartbeat("sandbox", fresh_worker), "{}")
    restarts: list[str] = []

    async def restart() -> Pin:
        restarts.append("again")
        return Pin("run-1", "toolq-new", fresh_worker, pinned_queue(fresh_worker), "i", "d")

    def pinned() -> RunPins:
        pins = RunPins()
        pins.pin(pin(restart))
        return pins

    async def unanswered(req: ToolCallRequest, queue: str) -> ToolCallResult:
        return ToolCallResult.failure(req, "no_answer", "Error: no worker took it")

    answer = await pinned().call(request(), "sandbox", unanswered, redis)
    assert answer.error_kind == "environment_lost" and restarts == []

    sent: list[str] = []

    async def lost_with_those_words(req: ToolCallRequest, queue: str) -> ToolCallResult:
        sent.append(queue)
        if len(sent) > 1:
            return ToolCallResult(task_id=req.task_id, tool=req.tool, output="ran")
        return ToolCallResult.failure(
            req, "environment_lost", "Error: no container here (its time ran out waiting)"
        )

    answer = await pinned().call(request(), "sandbox", lost_with_those_words, redis)
    assert restarts == ["again"] and sent == [pinned_queue(WORKER), pinned_queue(fresh_worker)]
    assert answer.output.endswith("\nran")
