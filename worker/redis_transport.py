"""Kombu's Redis transport, with one Redis client per channel instead of one per command.

Kombu's Redis channel builds a new ``redis.Redis`` for every message it publishes, every
acknowledgement, every index update and every task event (``Channel.conn_or_acquire``). With
redis-py 8 building one costs more CPU than the round trip it is built for (about 0.1 ms: the
client registers its response callbacks and its event dispatcher anew), and a worker's consumer,
Celery's busiest process, builds five per task. They all draw connections from the channel's one
pool, and a ``redis.Redis`` is safe to share between threads (each command takes a
connection from the pool), so this channel keeps one and hands it out each time.

Every Celery app of toolq's (the tool pools' workers, the agents workers, the callers') names
this transport for a ``redis://`` broker. Other brokers keep kombu's own, ``rediss://`` too:
kombu gives it its TLS defaults by the transport's name.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kombu.transport import redis as kombu_redis

#: Celery's ``broker_transport`` setting for a plain Redis broker.
TRANSPORT = f"{__name__}:Transport"


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    _shared_client: Any = None

    @contextmanager
    def conn_or_acquire(self, client: Any = None) -> Iterator[Any]:
        if client:
            yield client
            return
        shared = self._shared_client
        # The channel makes a new pool after a disconnect: a client of the old one is not kept.
        if shared is None or shared.connection_pool is not self.pool:
            shared = self._shared_client = self._create_client()
        yield shared


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


def transport_setting(broker_url: str) -> dict[str, Any]:
    """The Celery settings that put a ``redis://`` broker on this transport; none for others."""
    return {"broker_transport": TRANSPORT} if broker_url.startswith("redis://") else {}
