"""A batch of calls on a real Redis broker, read back by Celery's own event receiver (what
Flower and ``celery events`` run): every call's task-sent event arrives, and a batch's events
travel in one message rather than one per call."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from api.calls.broker import producer_app
from api.calls.publishing import CallPublisher
from tests.conftest import RedisServer, fleet_settings, task_events_channel, wait_for
from worker.contract.settings import FleetSettings
from worker.contract.wire import ToolCallRequest, ToolContextSnapshot

pytestmark = pytest.mark.integration

CALLS = 12


class EventWatch:
    """Celery's event receiver on a thread of its own, keeping the task-sent events it reads."""

    def __init__(self, app: Celery) -> None:
        self.sent: list[dict[str, Any]] = []
        self._app = app
        self._receiver: Any = None
        self._thread = threading.Thread(target=self._capture, daemon=True)

    def _capture(self) -> None:
        with self._app.connection_for_read() as connection:
            self._receiver = self._app.events.Receiver(
                connection, handlers={"task-sent": self.sent.append, "*": lambda _: None}
            )
            self._receiver.capture(limit=None, timeout=60, wakeup=False)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        if self._receiver is not None:
            self._receiver.should_stop = True
        self._thread.join(timeout=10)


@pytest.fixture
def settings(own_redis: RedisServer, tmp_path: Path) -> FleetSettings:
    # A Redis of the test's own: no other client's subscriptions, no worker taking the calls.
    return fleet_settings(own_redis.url, tmp_path)


@pytest.fixture
def events_channel(settings: FleetSettings) -> Iterator[redis.client.PubSub]:
    with task_events_channel(settings.redis_url) as listening:
        yield listening


def requests(count: int) -> list[ToolCallRequest]:
    return [
        ToolCallRequest(
            task_id=f"call-{index}-{uuid.uuid4().hex}",
            run_id="run-1",
            tool="write_file",
            arguments={"path": "a.txt", "content": "private"},
            context=ToolContextSnapshot(),
            timeout_ms=1000,
            deadline=time.time() + 60,
            reply_to="toolq:reply:publishing-test",
        )
        for index in range(count)
    ]


def messages_on(channel: redis.client.PubSub, quiet_s: float = 0.5) -> int:
    """The messages published on ``channel`` until none came for ``quiet_s``."""
    count = 0
    while channel.get_message(timeout=quiet_s) is not None:
        count += 1
    return count


def publish(app: Celery, settings: FleetSettings, calls: list[ToolCallRequest]) -> None:
    with app.producer_pool.acquire(block=True) as producer:
        CallPublisher(app, settings).send([(call, "tools") for call in calls], producer)


def test_a_batchs_task_sent_events_reach_celerys_receiver_in_one_message(
    settings: FleetSettings, events_channel: redis.client.PubSub
) -> None:
    app = producer_app(settings)
    watch = EventWatch(app)
    client = redis.Redis.from_url(settings.redis_url)
    # The receiver listens once its subscription is counted, beside the counting one.
    patterns = client.pubsub_numpat()
    watch.start()
    wait_for(lambda: client.pubsub_numpat() > patterns, what="Celery's event receiver to subscribe")
    calls = requests(CALLS)
    try:
        publish(app, settings, calls)
        wait_for(lambda: len(watch.sent) >= CALLS, timeout=30, what="every call's task-sent event")
    finally:
        watch.stop()
        client.close()

    assert sorted(event["uuid"] for event in watch.sent) == sorted(c.task_id for c in calls)
    for event in watch.sent:
        assert event["name"] == "toolq.execute_tool"
        assert event["queue"] == "tools"
        assert event["args"] == "('write_file', run 'run-1')"
    assert messages_on(events_channel) == 1


def test_no_events_are_sent_when_monitoring_asks_for_none(
    settings: FleetSettings, events_channel: redis.client.PubSub
) -> None:
    app = producer_app(settings)
    app.conf.task_send_sent_event = False
    publish(app, settings, requests(3))
    with redis.Redis.from_url(settings.redis_url) as client:
        assert client.llen("tools") == 3
    assert messages_on(events_channel) == 0
