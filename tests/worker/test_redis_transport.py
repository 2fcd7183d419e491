"""toolq's Redis transport: kombu's, with one Redis client per channel, on a real Redis."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
import redis
from kombu import Connection, Exchange, Queue
from kombu.common import ignore_errors

from api.agents.app import agents_config
from api.calls.broker import producer_app, producer_config
from api.settings import OrchestratorSettings
from tests.conftest import RedisServer
from worker.app import celery_config, create_celery_app
from worker.contract.settings import WorkerSettings
from worker.plumbing.redis_transport import TRANSPORT, Channel, Transport, transport_setting

MESSAGES = 200


class ClientsBuilt:
    """Counts the ``redis.Redis`` objects built while it is installed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        build = redis.Redis.__init__

        def counting(client: redis.Redis, *args: Any, **kwargs: Any) -> None:
            self.count += 1
            build(client, *args, **kwargs)

        monkeypatch.setattr(redis.Redis, "__init__", counting)


@pytest.fixture
def clients_built(monkeypatch: pytest.MonkeyPatch) -> ClientsBuilt:
    return ClientsBuilt(monkeypatch)


@pytest.fixture
def queue() -> Queue:
    name = f"transport-{uuid.uuid4().hex[:8]}"
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def round_trip(url: str, transport: str | None, queue: Queue) -> list[int]:
    """Publish MESSAGES messages, then take and acknowledge each: a worker's commands."""
    with Connection(url, transport=transport) as conn:
        producer = conn.Producer()
        for number in range(MESSAGES):
            producer.publish(
                {"n": number},
                exchange=queue.exchange,
                routing_key=queue.name,
                declare=[queue],
                serializer="json",
            )
        received: list[int] = []
        bound = queue(conn.default_channel)
        while (message := bound.get(no_ack=False)) is not None:
            received.append(message.payload["n"])
            message.ack()
        return received


def test_every_app_names_it_for_a_redis_broker() -> None:
    url = "redis://127.0.0.1:1/0"
    orchestrator = OrchestratorSettings(broker_url=url)
    for config in (
        celery_config(WorkerSettings(broker_url=url)),
        producer_config(orchestrator),
        agents_config(orchestrator),
    ):
        assert config["broker_transport"] == TRANSPORT


def test_celery_connects_through_it() -> None:
    # What Celery makes of the setting, for the workers' app and the callers' (nothing connects).
    settings = WorkerSettings(broker_url="redis://127.0.0.1:1/0")
    for app in (create_celery_app(settings), producer_app(settings)):
        with app.connection_for_write() as conn:
            assert isinstance(conn.transport, Transport)


@pytest.mark.parametrize("url", ["amqp://guest:guest@127.0.0.1:5672//", "rediss://127.0.0.1:1/0"])
def test_other_brokers_keep_kombus_own_transport(url: str) -> None:
    # rediss:// in particular: kombu gives it its TLS defaults by the scheme's name.
    assert transport_setting(url) == {}
    assert "broker_transport" not in celery_config(
        WorkerSettings(broker_url=url, result_backend="redis://127.0.0.1:1/0")
    )


@pytest.mark.integration
def test_a_channel_builds_one_client_for_all_its_commands(
    redis_server: RedisServer, queue: Queue, clients_built: ClientsBuilt
) -> None:
    received = round_trip(redis_server.url, TRANSPORT, queue)
    assert received == list(range(MESSAGES))
    # The channel's shared client, and the one kombu keeps for blocking reads.
    assert clients_built.count <= 3


@pytest.mark.integration
def test_kombus_own_builds_one_per_command(
    redis_server: RedisServer, queue: Queue, clients_built: ClientsBuilt
) -> None:
    # What the transport is for: the same work on kombu's channel builds a client for each
    # publish and each acknowledgement.
    assert round_trip(redis_server.url, None, queue) == list(range(MESSAGES))
    assert clients_built.count >= 2 * MESSAGES


@pytest.mark.integration
def test_a_new_pool_gets_a_new_client(redis_server: RedisServer, queue: Queue) -> None:
    with Connection(redis_server.url, transport=TRANSPORT) as conn:
        channel = conn.default_channel
        assert isinstance(channel, Channel)
        producer = conn.Producer(channel)
        producer.publish({"n": 1}, exchange=queue.exchange, routing_key=queue.name, declare=[queue])
        with channel.conn_or_acquire() as first:
            pass
        # What a channel does when its connections are dropped: a later command makes a new pool.
        channel._disconnect_pools()
        producer.publish({"n": 2}, exchange=queue.exchange, routing_key=queue.name, declare=[queue])
        with channel.conn_or_acquire() as second:
            assert second is not first
            assert second.connection_pool is channel.pool
        bound = queue(channel)
        assert [bound.get(no_ack=True).payload["n"] for _ in range(2)] == [1, 2]


@pytest.mark.integration
def test_a_broker_refusing_writes_neither_loses_a_message_nor_stops_acknowledging(
    own_redis: RedisServer, queue: Queue
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    with Connection(own_redis.url, transport=TRANSPORT) as conn:
        channel = conn.default_channel
        # As a worker's consumer takes them: one unacknowledged message holds the channel.
        channel.basic_qos(0, 1, False)
        producer = conn.Producer(channel)
        for number in range(3):
            producer.publish(
                {"n": number}, exchange=queue.exchange, routing_key=queue.name, declare=[queue]
            )
        bound = queue(channel)
        before = bound.get(no_ack=False)  # recorded as unacknowledged while writes are taken
        assert before is not None
        client.config_set("maxmemory-policy", "noeviction")
        client.config_set("maxmemory", "1")
        try:
            # Kombu raises on both (the consumer then stops for good): taken and acknowledged.
            during = bound.get(no_ack=False)
            assert during is not None and during.payload == {"n": 1}
            during.ack()
            before.ack()
        finally:
            client.config_set("maxmemory", "0")
        # Nothing is held against the prefetch limit: the channel takes the next message.
        assert channel.qos.can_consume()
        after = bound.get(no_ack=False)
        assert after is not None and after.payload == {"n": 2}
        after.ack()
        # The record the refused acknowledgement left: handed out again after the visibility
        # timeout, and answered from its stored result.
        assert client.hkeys(channel.unacked_key) == [before.delivery_tag.encode()]
    client.close()


@pytest.mark.integration
def test_a_channel_closed_after_its_connection_leaves_its_messages_to_the_visibility_timeout(
    own_redis: RedisServer, queue: Queue
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    conn = Connection(own_redis.url, transport=TRANSPORT)
    channel = conn.default_channel
    producer = conn.Producer(channel)
    producer.publish({"n": 1}, exchange=queue.exchange, routing_key=queue.name, declare=[queue])
    taken = queue(channel).get(no_ack=False)
    assert taken is not None
    # What Celery's clean-up after a lost broker can leave: the channel's pools dropped and its
    # connection closed, then the channel closed, which hands its messages back through it.
    channel._disconnect_pools()
    conn.transport.client = None
    # Celery closes it so, ignoring connection errors; kombu's AttributeError got through.
    ignore_errors(conn, channel.close)
    assert client.hkeys(channel.unacked_key) == [taken.delivery_tag.encode()]
    client.close()


@pytest.mark.integration
def test_a_message_taken_is_recorded_until_acknowledged_with_kombus_key_prefix_too(
    own_redis: RedisServer, queue: Queue
) -> None:
    client = redis.Redis.from_url(own_redis.url)
    for prefix in ("", "fleet-a:"):
        options = {"global_keyprefix": prefix} if prefix else {}
        with Connection(own_redis.url, transport=TRANSPORT, transport_options=options) as conn:
            channel = conn.default_channel
            producer = conn.Producer(channel)
            producer.publish(
                {"n": 1}, exchange=queue.exchange, routing_key=queue.name, declare=[queue]
            )
            first = queue(channel).get(no_ack=False)
            assert first is not None
            tag = first.delivery_tag.encode()
            # Recorded where kombu's own path looks for it, and handed out again from the
            # record as for a worker that died with it.
            assert client.hkeys(f"{prefix}unacked") == [tag]
            assert client.zrange(f"{prefix}unacked_index", 0, -1) == [tag]
            channel.qos.restore_by_tag(first.delivery_tag)
            taken = queue(channel).get(no_ack=False)
            assert taken is not None and taken.payload == {"n": 1}
            taken.ack()
            assert client.hkeys(f"{prefix}unacked") == []
            assert client.zrange(f"{prefix}unacked_index", 0, -1) == []
    client.close()
