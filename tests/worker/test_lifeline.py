"""A worker serves or exits: what says it serves, and the heartbeat that listens to it. The
exits themselves, on real worker processes, are in tests/reliability/test_deaf_workers.py."""

from __future__ import annotations

import threading

import pytest
import redis

from tests.conftest import Clock, wait_for
from worker.app import create_celery_app
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.plumbing import heartbeat
from worker.plumbing.heartbeat import Heartbeat
from worker.plumbing.lifeline import STALE_AFTER_S, ConsumerVitals, LoopTurns, ServingWorker


def test_a_consumer_serves_while_its_loop_turns() -> None:
    clock = Clock()
    vitals = ConsumerVitals(clock)
    assert not vitals.serving()  # not started yet
    vitals.turned()
    assert vitals.serving()
    clock.now += STALE_AFTER_S  # a loop that stopped turning: away, or stuck
    assert not vitals.serving()
    vitals.turned()
    assert vitals.serving()


def test_a_consumer_lost_for_good_never_serves_again() -> None:
    vitals = ConsumerVitals(Clock())
    vitals.turned()
    assert vitals.lose()
    assert not vitals.lose()  # said once
    vitals.turned()
    assert not vitals.serving()


def test_the_workers_app_serves_or_exits() -> None:
    app = create_celery_app(WorkerSettings(broker_url="redis://127.0.0.1:1/0"))
    assert issubclass(app.Worker, ServingWorker)
    assert LoopTurns in app.steps["consumer"]


@pytest.fixture
def quick_beats(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(heartbeat, "HEARTBEAT_INTERVAL_S", 0.02)


@pytest.mark.integration
@pytest.mark.usefixtures("quick_beats")
def test_a_heartbeat_beats_only_while_the_worker_serves(redis_client: redis.Redis) -> None:
    serves = threading.Event()
    refused = threading.Semaphore(0)

    def serving() -> bool:
        if serves.is_set():
            return True
        refused.release()
        return False

    beat = Heartbeat(redis_client, "lifeline-test@host", ["tools"], [], serving=serving)
    key = keys.worker_heartbeat("tools", "lifeline-test@host")
    serves.set()
    beat.start()
    try:
        serves.clear()
        assert refused.acquire(timeout=10)  # a beat on its way as it stopped serving is done
        redis_client.delete(key)
        assert refused.acquire(timeout=10)  # and a whole turn went by since, with no beat
        assert redis_client.get(key) is None
        serves.set()
        wait_for(lambda: redis_client.get(key) is not None, what="the heartbeat to beat again")
    finally:
        beat.stop()
    assert redis_client.get(key) is None


@pytest.mark.integration
@pytest.mark.usefixtures("quick_beats")
def test_a_stopped_heartbeat_leaves_no_thread_behind(redis_client: redis.Redis) -> None:
    """Its owner closes the Redis client once stop() returns: a beat on its way must be over."""
    in_turn = threading.Event()
    stop_asked = threading.Event()

    def serving() -> bool:
        # A turn holds here until stop() is on its way: its beat goes out as stop() runs.
        in_turn.set()
        assert stop_asked.wait(10)
        return True

    class Watched(Heartbeat):
        def stop(self) -> None:
            stop_asked.set()
            super().stop()

    before = set(threading.enumerate())
    beat = Watched(redis_client, "stop-test@host", ["tools"], [], serving=serving)
    beat.start()
    (thread,) = set(threading.enumerate()) - before
    assert in_turn.wait(10)
    beat.stop()
    assert not thread.is_alive()
    assert redis_client.get(keys.worker_heartbeat("tools", "stop-test@host")) is None
