"""How many calls wait in each pool's queue, as the call watch and the agents client read it
from their event loop: the same counts as ``queue_depths``, and no thread for them on Redis."""

from __future__ import annotations

import threading

import pytest
import redis

from api.calls.fleet import queue_depths, read_queue_depths
from tests.conftest import RedisServer
from worker.contract.keys import queue_lists
from worker.contract.settings import FleetSettings
from worker.contract.wire import AGENTS_QUEUE

pytestmark = pytest.mark.integration


async def test_waiting_messages_are_counted_at_every_priority_without_a_thread(
    own_redis: RedisServer,
) -> None:
    settings = FleetSettings(broker_url=own_redis.url)
    client = redis.Redis.from_url(own_redis.url)
    try:
        tools_lists = queue_lists("tools")
        client.rpush(tools_lists[0], "a", "b")
        client.rpush(tools_lists[-1], "c")  # a message sent at a priority
        client.rpush(AGENTS_QUEUE, "d")
        threads_before = threading.active_count()
        depths = await read_queue_depths(settings, ["tools", "sandbox", AGENTS_QUEUE])
        assert threading.active_count() == threads_before
    finally:
        client.close()
    assert depths == {"tools": 3, "sandbox": 0, AGENTS_QUEUE: 1}
    assert depths == queue_depths(settings, ["tools", "sandbox", AGENTS_QUEUE])
