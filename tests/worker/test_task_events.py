"""A worker's task events travel a batch to a message: the events of a while are published
together, on a real Redis, by Celery's own event dispatcher; a stopping consumer sends what it
holds. Flower reading them from real workers is tests/e2e/test_flower.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis
from celery import Celery

from tests.conftest import RedisServer, fleet_settings, task_events_channel
from worker.app import create_celery_app
from worker.contract.settings import WorkerSettings
from worker.plumbing.task_events import FLUSH_AFTER_S, BatchedTaskEvents


@dataclass
class Entry:
    """A timer entry as kombu's loop gives one back: it can be cancelled."""

    callback: Callable[..., None]
    args: tuple[Any, ...]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class Loop:
    """The consumer's event loop, turned by hand: what it was asked to run soon and later."""

    soon: list[tuple[Callable[..., None], tuple[Any, ...]]] = field(default_factory=list)
    later: list[tuple[float, Entry]] = field(default_factory=list)

    def call_soon(self, callback: Callable[..., None], *args: Any) -> None:
        self.soon.append((callback, args))

    def call_later(self, delay: float, callback: Callable[..., None], *args: Any) -> Entry:
        entry = Entry(callback, args)
        self.later.append((delay, entry))
        return entry

    def turn(self) -> None:
        ready, self.soon = self.soon, []
        for callback, args in ready:
            callback(*args)

    def fire_timers(self) -> None:
        due, self.later = self.later, []
        for _, entry in due:
            if not entry.cancelled:
                entry.callback(*entry.args)


@dataclass
class Consumer:
    """What the step reads of Celery's consumer: its loop and its event dispatcher."""

    hub: Loop
    event_dispatcher: Any


def test_the_workers_app_batches_its_task_events() -> None:
    app = create_celery_app(WorkerSettings(broker_url="redis://127.0.0.1:1/0"))
    assert BatchedTaskEvents in app.steps["consumer"]


@pytest.fixture
def app(own_redis: RedisServer, tmp_path: Path) -> Celery:
    return create_celery_app(fleet_settings(own_redis.url, tmp_path))


@pytest.fixture
def events_channel(own_redis: RedisServer) -> Iterator[redis.client.PubSub]:
    with task_events_channel(own_redis.url) as listening:
        yield listening


@pytest.fixture
def consumer(app: Celery) -> Iterator[Consumer]:
    """A consumer's event dispatcher made as Celery's Events step makes it, on the loop above."""
    loop = Loop()
    with app.connection_for_write() as connection:
        dispatcher = app.events.Dispatcher(
            connection, hostname="events-test@host", buffer_group=["task"]
        )
        yield Consumer(loop, dispatcher)
        dispatcher.close()


@pytest.fixture
def step(consumer: Consumer) -> BatchedTaskEvents:
    """The step, started on the consumer as Celery starts it, after its Events step."""
    started = BatchedTaskEvents(consumer)
    started.start(consumer)
    return started


def published(channel: redis.client.PubSub) -> list[list[str]]:
    """The messages published so far, each as the uuids of the task events it carries."""
    messages = []
    while (message := channel.get_message(timeout=0.5)) is not None:
        envelope = json.loads(message["data"])
        events = json.loads(base64.b64decode(envelope["body"]))
        messages.append([event["uuid"] for event in events])
    return messages


@pytest.mark.integration
def test_the_events_of_a_while_travel_in_one_message(
    step: BatchedTaskEvents, consumer: Consumer, events_channel: redis.client.PubSub
) -> None:
    for task, kind in [("a", "received"), ("a", "started"), ("b", "received"), ("a", "succeeded")]:
        consumer.event_dispatcher.send(f"task-{kind}", uuid=task)
    consumer.hub.turn()
    assert [delay for delay, _ in consumer.hub.later] == [FLUSH_AFTER_S]  # one publication
    assert published(events_channel) == []  # held until then
    consumer.hub.fire_timers()
    assert published(events_channel) == [["a", "a", "b", "a"]]
    # The next event waits for a publication of its own.
    consumer.event_dispatcher.send("task-started", uuid="b")
    consumer.hub.turn()
    consumer.hub.fire_timers()
    assert published(events_channel) == [["b"]]


@pytest.mark.integration
def test_a_stopping_consumer_sends_the_events_it_holds(
    step: BatchedTaskEvents, consumer: Consumer, events_channel: redis.client.PubSub
) -> None:
    consumer.event_dispatcher.send("task-succeeded", uuid="a")
    consumer.hub.turn()
    step.stop(consumer)
    assert published(events_channel) == [["a"]]
    consumer.hub.fire_timers()  # the publication it had planned is cancelled
    assert published(events_channel) == []
