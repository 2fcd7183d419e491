"""What the fleet offers right now: tools from the workers' manifest, live workers per pool."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import redis

from worker.app import create_app
from worker.manifest import ToolSpec, live_workers, read_manifest
from worker.settings import Settings
from worker.tools.interface import POOLS

#: Where kombu's Redis transport keeps delivered, unacknowledged messages.
UNACKED_HASH = "unacked"
#: Separator kombu puts between a Redis queue's name and its priority step.
PRIORITY_SEP = "\x06\x16"


class NoWorkersError(RuntimeError):
    """No worker has published its tools: start workers, or run without a broker (local mode)."""


@dataclass(frozen=True)
class Fleet:
    tools: dict[str, ToolSpec]
    workers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)

    def serves(self, name: str) -> bool:
        spec = self.tools.get(name)
        return spec is not None and bool(self.workers.get(spec.pool))

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


def queue_depths(settings: Settings) -> dict[str, int]:
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
    with create_app(settings).connection_for_write() as conn:
        for pool in POOLS:
            try:
                declared = conn.default_channel.queue_declare(queue=pool, passive=True)
                depths[pool] = int(declared.message_count)
            except conn.channel_errors:
                depths[pool] = 0  # not declared yet: no worker has consumed from it
                conn.close()
    return depths


def calls_in_flight(settings: Settings) -> int:
    """Calls taken by a worker and not yet acknowledged."""
    broker = settings.effective_broker_url
    if broker.startswith(("redis", "rediss")):
        client = redis.Redis.from_url(broker)
        try:
            return int(client.hlen(UNACKED_HASH))
        finally:
            client.close()
    active = create_app(settings).control.inspect(timeout=1.0).active() or {}
    return sum(len(tasks) for tasks in active.values())
