"""What the fleet offers right now: tools from the workers' manifest, live workers per pool."""

from __future__ import annotations

from dataclasses import dataclass, field

import redis

from api.broker import producer_app
from worker.protocol import POOLS, ToolSpec, WorkerInfo, keys
from worker.settings import FleetSettings

#: Where kombu's Redis transport keeps delivered, unacknowledged messages.
UNACKED_HASH = "unacked"
#: Separator kombu puts between a Redis queue's name and its priority step.
PRIORITY_SEP = "\x06\x16"


class NoWorkersError(RuntimeError):
    """No worker has published its tools: start workers, or run without a broker (local mode)."""


@dataclass(frozen=True)
class Fleet:
    tools: dict[str, ToolSpec]
    workers: dict[str, list[WorkerInfo]] = field(default_factory=dict)

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
    client = redis.Redis.from_url(redis_url)
    try:
        return Fleet(
            tools=read_manifest(client),
            workers={pool: live_workers(client, pool) for pool in POOLS},
        )
    finally:
        client.close()


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


def queue_depths(settings: FleetSettings) -> dict[str, int]:
    """Messages waiting in each pool's queue."""
    broker = settings.effective_broker_url
    if broker.startswith(("redis", "rediss")):
        # Kombu keeps a Redis queue as a list named after it (plus one list per priority step).
        client = redis.Redis.from_url(broker)
        try:
            return {
                pool: sum(
                    int(client.llen(name))
                    for name in [pool, *(f"{pool}{PRIORITY_SEP}{step}" for step in (3, 6, 9))]
                )
                for pool in POOLS
            }
        finally:
            client.close()
    depths: dict[str, int] = {}
    with producer_app(settings).connection_for_write() as conn:
        for pool in POOLS:
            try:
                declared = conn.default_channel.queue_declare(queue=pool, passive=True)
                depths[pool] = int(declared.message_count)
            except conn.channel_errors:
                depths[pool] = 0  # not declared yet: no worker has consumed from it
                conn.close()
    return depths


def calls_in_flight(settings: FleetSettings) -> int:
    """Calls taken by a worker and not yet acknowledged."""
    broker = settings.effective_broker_url
    if broker.startswith(("redis", "rediss")):
        client = redis.Redis.from_url(broker)
        try:
            return int(client.hlen(UNACKED_HASH))
        finally:
            client.close()
    active = producer_app(settings).control.inspect(timeout=1.0).active() or {}
    return sum(len(tasks) for tasks in active.values())
