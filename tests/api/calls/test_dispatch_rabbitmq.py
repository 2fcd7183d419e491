"""The same fleet with RabbitMQ as the broker (results stay in Redis)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import (
    Caller,
    RedisServer,
    WorkerFleet,
    assert_files_round_trip,
    fleet_settings,
    wait_for,
)
from tests.rabbitmq import AMQP_URL, require_rabbitmq
from worker.app import create_celery_app
from worker.contract.wire import POOLS

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def amqp_fleet(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerFleet]:
    require_rabbitmq()
    root = tmp_path_factory.mktemp("amqp-workspaces")
    root.chmod(0o755)
    settings = fleet_settings(
        AMQP_URL, root, result_backend=redis_server.url.rsplit("/", 1)[0] + "/7"
    )
    # The queues live in RabbitMQ's default vhost: start from empty ones.
    with create_celery_app(settings).connection_for_write() as conn:
        channel = conn.default_channel
        for pool in POOLS:
            channel.queue_declare(queue=pool, durable=True, auto_delete=False)
            channel.queue_purge(pool)
    fleet = WorkerFleet(settings).start()
    yield fleet
    fleet.stop()


@pytest.fixture
async def amqp_call(amqp_fleet: WorkerFleet) -> AsyncIterator[Caller]:
    async with Dispatcher(amqp_fleet.settings) as dispatcher:
        yield Caller(dispatcher, amqp_fleet.settings, f"run-amqp-{os.urandom(4).hex()}")


async def test_tools_round_trip_over_rabbitmq(amqp_call: Caller) -> None:
    await assert_files_round_trip(amqp_call, "rabbit")
    refused = await amqp_call("run_bash", {"command": "true"}, pool="tools")
    assert refused.error_kind == "wrong_pool"


async def test_many_calls_in_parallel_over_rabbitmq(amqp_call: Caller) -> None:
    results = await asyncio.gather(*(amqp_call("noop", {}) for _ in range(200)))
    assert all(r.output == "ok" for r in results)


@pytest.mark.parametrize(("tool", "expected_runs"), [("slow_read", 2), ("slow_write", 1)])
async def test_a_worker_killed_mid_call_over_rabbitmq(
    amqp_call: Caller, amqp_fleet: WorkerFleet, tool: str, expected_runs: int
) -> None:
    runs = Path(amqp_fleet.settings.workspace_root) / amqp_call.run_id / "k.runs"

    def running_child() -> int:
        # The fleet's first call: on a loaded machine its worker may take a while to fork.
        wait_for(
            lambda: runs.exists() and runs.read_text().strip() != "",
            timeout=30,
            what="the call to start on a worker",
        )
        return int(runs.read_text().split()[0])

    pending = asyncio.ensure_future(amqp_call(tool, {"seconds": 1.5, "marker": "k"}))
    os.kill(await asyncio.to_thread(running_child), signal.SIGKILL)
    result = await asyncio.wait_for(pending, 30)
    if tool == "slow_read":
        assert result.output == "slept 1.5s"
    else:
        assert result.error_kind == "interrupted"
    assert runs.read_text().count("\n") == expected_runs
