"""Kombu's Redis transport, with one Redis client per channel instead of one per command.

Kombu's Redis channel builds a new ``redis.Redis`` for every message it publishes, every
acknowledgement, every index update and every task event (``Channel.conn_or_acquire``). With
redis-py 8 building one costs more CPU than the round trip it is built for (about 0.1 ms: the
client registers its response callbacks and its event dispatcher anew), and a worker's consumer,
Celery's busiest process, builds five per task. They all draw connections from the channel's one
pool, and a ``redis.Redis`` is safe to share between threads (each command takes a
connection from the pool), so this channel keeps one and hands it out each time.

The channel also rides out two faults that would otherwise stop a worker's consumer for good
("Unrecoverable error"): a Redis that refuses writes for a while (``QoS``), and a restore of
unacknowledged messages through a connection already closed (``_connparams``).

Every Celery app of toolq's (the tool pools' workers, the agents workers, the callers') names
this transport for a ``redis://`` broker. Other brokers keep kombu's own, ``rediss://`` too:
kombu gives it its TLS defaults by the transport's name.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from kombu.transport import redis as kombu_redis
from kombu.transport import virtual
from kombu.utils.json import dumps

from worker.plumbing.store_refusals import REFUSED_WRITES

log = logging.getLogger(__name__)

#: Celery's ``broker_transport`` setting for a plain Redis broker.
TRANSPORT = f"{__name__}:Transport"


class QoS(kombu_redis.QoS):  # type: ignore[misc]
    """Kombu's acknowledgements, through a Redis that refuses writes for a while.

    A message taken is recorded as unacknowledged (so that it is handed out again if its worker
    dies) and the record is removed when it is acknowledged. Both are writes, which Redis refuses
    at ``maxmemory`` with ``noeviction`` (in a transaction, every command) or as a read-only
    replica; kombu raises, and the consumer stops for good. Here a message whose record could not
    be written runs all the same: it is already off the queue, and the call's start marker keeps
    it at most once (if this worker dies mid-call, nothing hands it out again; its caller's
    deadline answers for it). A record that could not be removed stays: the message comes back
    after the visibility timeout and is answered from its stored result.

    The record is written and removed in kombu's transactions (MULTI, the two commands, EXEC)
    sent straight on a connection of the channel's client: redis-py's pipeline object cost about
    three times the round trip's CPU, twice per message in a worker's consumer. A connection
    that fails goes back to kombu's own path, which retries; keys with kombu's global prefix
    take that path too.
    """

    def append(self, message: Any, delivery_tag: Any) -> None:
        delivery = message.delivery_info
        record = dumps([message._raw, delivery["exchange"], delivery["routing_key"]])
        try:
            if not self._in_one_write(
                ("ZADD", self.unacked_index_key, time.time(), delivery_tag),
                ("HSET", self.unacked_key, delivery_tag, record),
            ):
                super().append(message, delivery_tag)
                return
        except REFUSED_WRITES as exc:
            log.warning("message %s taken without its unacknowledged record: %s", delivery_tag, exc)
        virtual.QoS.append(self, message, delivery_tag)

    def ack(self, delivery_tag: Any) -> None:
        try:
            if not self._in_one_write(
                ("ZREM", self.unacked_index_key, delivery_tag),
                ("HDEL", self.unacked_key, delivery_tag),
            ):
                super().ack(delivery_tag)
                return
        except REFUSED_WRITES as exc:
            log.warning("message %s acknowledged, its record left behind: %s", delivery_tag, exc)
        virtual.QoS.ack(self, delivery_tag)

    def _in_one_write(self, *commands: tuple[Any, ...]) -> bool:
        """``commands`` in a transaction written straight on a connection; False where kombu's
        own path must do it (a prefix on the keys, a connection that failed). A command refused
        raises, as redis-py's pipeline raises it: the first error."""
        if self.channel.global_keyprefix:
            return False
        with self.channel.conn_or_acquire() as client:
            pool = client.connection_pool
            connection = pool.get_connection()
            try:
                connection.send_packed_command(
                    connection.pack_commands([("MULTI",), *commands, ("EXEC",)])
                )
                refused: redis.ResponseError | None = None
                for _ in range(len(commands) + 2):
                    try:
                        connection.read_response()
                    except redis.ResponseError as exc:
                        refused = refused or exc
            except (redis.ConnectionError, redis.TimeoutError):
                connection.disconnect()
                return False
            except BaseException:
                connection.disconnect()
                raise
            finally:
                pool.release(connection)
        if refused is not None:
            raise refused
        return True

    def reject(self, delivery_tag: Any, requeue: bool = False) -> None:
        try:
            super().reject(delivery_tag, requeue=requeue)
        except REFUSED_WRITES as exc:
            log.warning("message %s rejected, its record left behind: %s", delivery_tag, exc)
            virtual.QoS.ack(self, delivery_tag)


class Channel(kombu_redis.Channel):  # type: ignore[misc]
    QoS = QoS
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

    def _connparams(self, asynchronous: bool = False) -> Any:
        # A channel closed after its connection (Celery does so when the broker goes away) tries
        # to hand its unacknowledged messages back through it; kombu then fails on the closed
        # connection's missing client with an AttributeError nothing catches, and the consumer
        # stops for good. As a connection error it is ignored like the rest of that clean-up:
        # the messages are handed out again after the visibility timeout.
        if self.connection.client is None:
            raise redis.ConnectionError("the broker connection is already closed")
        return super()._connparams(asynchronous)


class Transport(kombu_redis.Transport):  # type: ignore[misc]
    Channel = Channel


def transport_setting(broker_url: str) -> dict[str, Any]:
    """The Celery settings that put a ``redis://`` broker on this transport; none for others."""
    return {"broker_transport": TRANSPORT} if broker_url.startswith("redis://") else {}
