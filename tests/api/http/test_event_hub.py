"""The replica's reader of live events, on a Redis of its own: one blocking read whatever the
number of followers, every event to every follower once and in order, a follower that joins
behind the reader or falls behind it catching up from Redis."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.http import event_hub, sse
from api.http.event_hub import EventHub, Feed
from api.state.redis_clients import store_client
from api.state.run_end import RunEnd
from api.state.store import ApiStore
from tests.conftest import RedisServer

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def own_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A Redis whose only clients are this module's: its client list shows what the reader
    holds."""
    server = RedisServer(tmp_path_factory.mktemp("hub-redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
async def store(own_redis: RedisServer) -> AsyncIterator[ApiStore]:
    client = store_client(own_redis.url)
    yield ApiStore(client, retention_s=60)
    await client.aclose()


@pytest.fixture
async def hub(store: ApiStore) -> AsyncIterator[EventHub]:
    events = EventHub(store.redis)
    yield events
    await events.close()


async def new_run(store: ApiStore) -> str:
    run_id = uuid.uuid4().hex
    await store.renew_lease("replica")  # its replica is alive: the run is not reaped
    await store.create_run(run_id, "p", {}, "replica")
    assert await store.mark_running(run_id)
    return run_id


async def until(check: Callable[[], Awaitable[bool]], what: str) -> None:
    """Wait until ``check`` is true; fail naming ``what`` if it never becomes so."""
    try:
        async with asyncio.timeout(30):
            while not await check():
                await asyncio.sleep(0.01)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


def readers_blocked(own_redis: RedisServer, count: int) -> Callable[[], Awaitable[bool]]:
    """Whether ``count`` clients of this Redis wait in an XREAD."""

    async def check() -> bool:
        watcher = aioredis.Redis.from_url(own_redis.url)
        try:
            clients: list[dict[str, Any]] = await watcher.client_list()
        finally:
            await watcher.aclose()
        return sum(1 for c in clients if c["cmd"] == "xread" and "b" in c["flags"]) == count

    return check


async def take(feed: Feed, count: int) -> list[str]:
    """The ids of the next ``count`` events handed to ``feed``."""
    taken: list[str] = []
    async with asyncio.timeout(30):
        while len(taken) < count:
            taken += [entry_id for entry_id, _ in await feed.take(1.0)]
    return taken


def frame_id(frame: bytes) -> str:
    return frame.decode().split("\n", 1)[0].removeprefix("id: ")


async def test_many_followers_of_many_runs_cost_one_blocking_read(
    store: ApiStore, hub: EventHub, own_redis: RedisServer
) -> None:
    runs = [await new_run(store) for _ in range(3)]
    with contextlib.ExitStack() as following:
        feeds = {
            run_id: [following.enter_context(hub.follow(run_id, "0")) for _ in range(100)]
            for run_id in runs
        }
        await until(readers_blocked(own_redis, 1), "the reader to wait for events")

        written = {
            run_id: [await store.add_event(run_id, {"n": n}) for n in range(5)] for run_id in runs
        }
        for run_id in runs:
            for feed in feeds[run_id]:
                assert await take(feed, 5) == written[run_id]
        assert await readers_blocked(own_redis, 1)()

    # The last follower gone, the reader stops and gives its connection back.
    await until(readers_blocked(own_redis, 0), "the reader to stop")


async def test_a_stream_that_joins_behind_the_reader_misses_nothing(
    store: ApiStore, hub: EventHub
) -> None:
    run_id = await new_run(store)
    first = await store.add_event(run_id, {"type": "text_delta", "text": "a"})
    second = await store.add_event(run_id, {"type": "text_delta", "text": "b"})
    with hub.follow(run_id, second) as early:
        stream = sse.run_event_stream(store, hub, run_id, "0")
        frames = [await anext(stream)]  # it has read the first two from Redis
        # The reader moves past where the stream will join it.
        third = await store.add_event(run_id, {"type": "text_delta", "text": "c"})
        assert await take(early, 1) == [third]
        frames += [await anext(stream), await anext(stream)]
        fourth = await store.add_event(run_id, {"type": "text_delta", "text": "d"})
        frames.append(await anext(stream))
        await stream.aclose()
    assert [frame_id(frame) for frame in frames] == [first, second, third, fourth]


async def test_a_stream_too_slow_for_the_reader_catches_up_from_redis(
    store: ApiStore, hub: EventHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(event_hub, "FEED_LIMIT", 5)
    monkeypatch.setattr(sse, "SSE_IDLE_S", 0.05)
    run_id = await new_run(store)
    first = await store.add_event(run_id, {"type": "text_delta", "text": "0"})
    stream = sse.run_event_stream(store, hub, run_id, "0")
    assert frame_id(await anext(stream)) == first
    # A keep-alive: the stream follows the run live; it takes nothing while it is not read.
    while await anext(stream) != sse.KEEP_ALIVE:
        pass

    with hub.follow(run_id, first) as witness:
        written = [
            await store.add_event(run_id, {"type": "text_delta", "text": str(n)})
            for n in range(1, 20)
        ]
        assert await store.finish_run(run_id, RunEnd(status="succeeded"))

        async def handed_too_many() -> bool:
            return witness.fell_behind

        # The reader handed the stream as many events as the witness: more than it may hold.
        await until(handed_too_many, "the reader to hand out more than a feed holds")

    frames = [frame async for frame in stream if frame != sse.KEEP_ALIVE]
    assert [frame_id(frame) for frame in frames[:-1]] == written
    assert b'"type":"done"' in frames[-1]
