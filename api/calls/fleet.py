"""What the fleet offers right now: tools from the workers' manifest, live workers per pool, and
the live agents workers that run whole conversations."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import redis
import redis.asyncio as aioredis

from api.calls.broker import producer_app
from api.exceptions import NoWorkersError
from worker.contract.keys import UNACKED_HASH, keys, queue_lists
from worker.contract.settings import FleetSettings
from worker.contract.wire import AGENTS_QUEUE, POOLS, TASK_NAME, ToolSpec, WorkerInfo

#: How long a process that runs many conversations reuses its view of the fleet.
FLEET_TTL_S = 2.0


@dataclass(frozen=True)
class Fleet:
    tools: dict[str, ToolSpec]
    workers: dict[str, list[WorkerInfo]] = field(default_factory=dict)
    #: Live agents workers: not a tool pool, they run conversations (``toolq worker --pool
    #: agents``).
    agents: list[WorkerInfo] = field(default_factory=list)

    @property
    def model_tools(self) -> dict[str, ToolSpec]:
        """The tools a model may be offered: all but the service operations."""
        return {name: spec for name, spec in self.tools.items() if spec.for_model}

    def serves(self, name: str) -> bool:
        spec = self.tools.get(name)
        return spec is not None and bool(self.workers.get(spec.pool))

    def unserved(self, name: str) -> str | None:
        """Why no worker would run the tool ``name`` for a model; None when a live worker
        serves it."""
        spec = self.model_tools.get(name)
        if spec is None:
            known = ", ".join(self.model_tools) or "none"
            return f"no worker serves a tool named {name!r} (tools: {known})"
        if not self.workers.get(spec.pool):
            return f"no live worker serves the {spec.pool!r} pool of {name!r}"
        return None

    def require_tools(self) -> Fleet:
        if not self.tools:
            raise NoWorkersError(
                "No toolq worker has published its tools to this broker. Start workers "
                "(toolq worker --pool tools / --pool sandbox) or unset TOOLQ_BROKER_URL to "
                "run a local stack."
            )
        return self


def load_fleet(redis_url: str) -> Fleet:
    with redis.Redis.from_url(redis_url) as client:
        return Fleet(
            tools=read_manifest(client),
            workers={pool: live_workers(client, pool) for pool in POOLS},
            agents=live_workers(client, AGENTS_QUEUE),
        )


class CachedFleet:
    """The fleet as ``load`` reads it, read again once older than ``FLEET_TTL_S``: for a process
    that starts many conversations, each of which needs the fleet's tools."""

    def __init__(self, redis_url: str, *, load: Callable[[str], Fleet] = load_fleet) -> None:
        self._redis_url = redis_url
        self._load = load
        self._fleet: Fleet | None = None
        self._loaded_at = 0.0
        self._lock = asyncio.Lock()

    async def get(self) -> Fleet:
        async with self._lock:
            if self._fleet is None or time.monotonic() - self._loaded_at > FLEET_TTL_S:
                self._fleet = await asyncio.to_thread(self._load, self._redis_url)
                self._loaded_at = time.monotonic()
            return self._fleet


def read_manifest(client: redis.Redis) -> dict[str, ToolSpec]:
    """The tools workers have published, in their registration order."""
    raw: dict[bytes, bytes] = client.hgetall(keys.MANIFEST)  # type: ignore[assignment]
    specs = [ToolSpec.model_validate_json(v) for v in raw.values()]
    return {s.name: s for s in sorted(specs, key=lambda s: (s.position, s.name))}


def live_workers(client: redis.Redis, pool: str) -> list[WorkerInfo]:
    """The workers of ``pool`` whose heartbeat has not expired."""
    names = list(client.scan_iter(match=keys.worker_heartbeats(pool), count=500))
    if not names:
        return []
    return [WorkerInfo.model_validate_json(v) for v in client.mget(names) if v]


def queue_depths(settings: FleetSettings, queues: Iterable[str] = POOLS) -> dict[str, int]:
    """Messages waiting in each of ``queues`` (by default the tool pools')."""
    broker = settings.effective_broker_url
    if broker.startswith(("redis", "rediss")):
        # Kombu keeps a Redis queue as a list named after it (plus one list per priority step).
        with redis.Redis.from_url(broker) as client:
            return {
                pool: sum(int(client.llen(name)) for name in queue_lists(pool)) for pool in queues
            }
    depths: dict[str, int] = {}
    with producer_app(settings).connection_for_write() as conn:
        for pool in queues:
            try:
                declared = conn.default_channel.queue_declare(queue=pool, passive=True)
                depths[pool] = int(declared.message_count)
            except conn.channel_errors:
                depths[pool] = 0  # not declared yet: no worker has consumed from it
                conn.close()
    return depths


async def read_queue_depths(
    settings: FleetSettings, queues: Iterable[str] = POOLS
) -> dict[str, int]:
    """``queue_depths`` from a conversation's event loop. On a Redis broker, read on the loop
    itself: a thread of its own for each look would grow the orchestrator's threads with its
    load."""
    broker = settings.effective_broker_url
    if not broker.startswith(("redis", "rediss")):
        return await asyncio.to_thread(queue_depths, settings, queues)
    client = aioredis.Redis.from_url(broker)
    try:
        async with client.pipeline(transaction=False) as pipe:
            wanted = list(queues)
            for pool in wanted:
                for name in queue_lists(pool):
                    pipe.llen(name)
            lengths = iter(await pipe.execute())
        return {pool: sum(int(next(lengths)) for _ in queue_lists(pool)) for pool in wanted}
    finally:
        await client.aclose()


def calls_in_flight(settings: FleetSettings) -> int:
    """Calls taken by a worker and not yet acknowledged."""
    broker = settings.effective_broker_url
    if broker.startswith(("redis", "rediss")):
        with redis.Redis.from_url(broker) as client:
            return int(client.hlen(UNACKED_HASH))
    active = producer_app(settings).control.inspect(timeout=1.0).active() or {}
    # Agents workers answer too: their conversations are no tool calls.
    return sum(1 for tasks in active.values() for task in tasks if task.get("name") == TASK_NAME)
