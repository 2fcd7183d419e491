"""A Redis broker with the results on a Redis of their own (``TOOLQ_RESULT_BACKEND``): each
server carries its share of every call, so two carry more calls than one (``make bench``'s
case 11 measures each share). RabbitMQ as the broker is ``test_dispatch_rabbitmq.py``."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import queue_depths
from tests.conftest import (
    Caller,
    RedisServer,
    WorkerFleet,
    assert_files_round_trip,
    fleet_settings,
)
from worker.contract.keys import UNACKED_HASH, keys
from worker.contract.wire import POOLS

pytestmark = pytest.mark.integration


@dataclass
class SplitFleet:
    fleet: WorkerFleet
    broker: RedisServer
    results: RedisServer


@pytest.fixture(scope="module")
def split_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SplitFleet]:
    broker = RedisServer(tmp_path_factory.mktemp("broker-redis"))
    results = RedisServer(tmp_path_factory.mktemp("results-redis"))
    broker.start()
    results.start()
    root = tmp_path_factory.mktemp("split-workspaces")
    root.chmod(0o755)
    fleet = WorkerFleet(fleet_settings(broker.url, root, result_backend=results.url)).start()
    yield SplitFleet(fleet, broker, results)
    fleet.stop()
    broker.stop()
    results.stop()


@pytest.fixture
async def split_call(split_fleet: SplitFleet) -> AsyncIterator[Caller]:
    settings = split_fleet.fleet.settings
    async with Dispatcher(settings) as dispatcher:
        yield Caller(dispatcher, settings, f"run-split-{os.urandom(4).hex()}")


async def test_both_pools_answer_with_the_results_on_their_own_redis(split_call: Caller) -> None:
    await assert_files_round_trip(split_call, "split")
    results = await asyncio.gather(*(split_call("noop", {}) for _ in range(200)))
    assert all(r.output == "ok" for r in results)


async def test_each_redis_holds_only_its_share(split_call: Caller, split_fleet: SplitFleet) -> None:
    answered = await split_call("noop", {}, task_id=f"split-{os.urandom(4).hex()}")
    assert answered.output == "ok"
    broker = redis.Redis.from_url(split_fleet.broker.url, decode_responses=True)
    results = redis.Redis.from_url(split_fleet.results.url, decode_responses=True)
    try:
        # Results, start markers, replies, heartbeats and the manifest: the result store's.
        assert results.exists(keys.result(answered.task_id))
        assert results.exists(keys.MANIFEST)
        assert not list(broker.scan_iter(f"{keys.PREFIX}:*"))
        # Queues and the calls taken but not acknowledged: the broker's.
        assert not any(results.exists(name) for name in (*POOLS, UNACKED_HASH))
        assert queue_depths(split_fleet.fleet.settings) == {pool: 0 for pool in POOLS}
    finally:
        broker.close()
        results.close()
