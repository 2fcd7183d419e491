"""A call whose messages a broker keeps losing is sent again for as long as its deadline leaves
time to run it, after growing pauses; never once too soon, never once too late."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis
import redis.asyncio as aioredis

from api.calls.call_watch import SHOWN_TASK_IDS, CallWatch, InFlight, resend_pause
from tests.conftest import RedisServer, unconsumed_settings
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallRequest

pytestmark = pytest.mark.integration

RESEND_AFTER_S = 1.0


@dataclass
class Watched:
    """A watch over calls made by hand, and the messages it sent again."""

    watch: CallWatch
    store: aioredis.Redis
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    sent_again: list[str] = field(default_factory=list)

    def call(self, task_id: str, *, send_number: int, sent_s_ago: float, left_s: float) -> InFlight:
        """A call whose message ``send_number`` went out ``sent_s_ago``, ``left_s`` before its
        deadline."""
        request = ToolCallRequest(
            task_id=task_id,
            run_id="run-1",
            tool="run_bash",
            arguments={"command": "true"},
            timeout_ms=1000,
            deadline=time.time() + left_s,
            reply_to="toolq:reply:c1",
            send_number=send_number,
        )
        flight = InFlight(request, "sandbox", asyncio.get_running_loop().create_future())
        flight.sent_at = time.monotonic() - sent_s_ago
        self.in_flight[task_id] = flight
        return flight


@pytest.fixture
def settings(redis_server: RedisServer, tmp_path: Path) -> WorkerSettings:
    return unconsumed_settings(redis_server, tmp_path, resend_after_s=RESEND_AFTER_S)


@pytest.fixture
def client(settings: WorkerSettings) -> redis.Redis:
    return redis.Redis.from_url(settings.redis_url)


@pytest.fixture
async def watched(settings: WorkerSettings) -> AsyncIterator[Watched]:
    store = aioredis.Redis.from_url(settings.redis_url)
    in_flight: dict[str, InFlight] = {}
    sent_again: list[str] = []
    watch = CallWatch(
        store, settings, in_flight, lambda flight: sent_again.append(flight.request.task_id), "c1"
    )
    yield Watched(watch, store, in_flight, sent_again)
    await store.aclose()


def test_the_pause_before_a_call_is_sent_again_grows_and_is_bounded(
    settings: WorkerSettings,
) -> None:
    pauses = [resend_pause(settings, number) for number in range(1, 8)]
    assert pauses == sorted(pauses) and pauses[1] > pauses[0]
    assert max(pauses) == pauses[-1] == pauses[-2]  # bounded


async def test_a_call_whose_messages_keep_being_lost_is_sent_again_each_time(
    watched: Watched,
) -> None:
    # Its first message and the one sent again were both lost; the queue is empty.
    watched.call(
        "third", send_number=2, sent_s_ago=resend_pause(watched.watch.settings, 2), left_s=30
    )
    watched.call(
        "fourth", send_number=3, sent_s_ago=resend_pause(watched.watch.settings, 3), left_s=30
    )
    await watched.watch.look()
    assert sorted(watched.sent_again) == ["fourth", "third"]


async def test_a_call_sent_again_is_not_sent_once_more_before_its_longer_pause(
    watched: Watched,
) -> None:
    # The first pause has passed, not the second message's, which is longer.
    watched.call("waiting", send_number=2, sent_s_ago=RESEND_AFTER_S * 1.2, left_s=30)
    await watched.watch.look()
    assert watched.sent_again == []


async def test_a_message_lost_behind_a_queue_that_never_empties_is_sent_again_every_time(
    watched: Watched, client: redis.Redis
) -> None:
    client.rpush("sandbox", "another call, waiting")
    # Its second message is past half of the time it had left: sent again, queue or not.
    watched.call("behind", send_number=2, sent_s_ago=10.0, left_s=8.0)
    # Its second message went out a pause ago, with most of its time still left: it may be
    # the one waiting.
    watched.call(
        "queued", send_number=2, sent_s_ago=resend_pause(watched.watch.settings, 2), left_s=20.0
    )
    await watched.watch.look()
    assert watched.sent_again == ["behind"]


async def test_a_call_with_too_little_time_left_to_run_is_not_sent_again(
    watched: Watched,
) -> None:
    watched.call("late", send_number=3, sent_s_ago=30.0, left_s=RESEND_AFTER_S / 2)
    await watched.watch.look()
    assert watched.sent_again == []


async def test_calls_sent_again_in_one_look_make_one_log_line_that_counts_them(
    watched: Watched, caplog: pytest.LogCaptureFixture
) -> None:
    """A broker that lost many messages at once: the log says so once, not once a call."""
    lost = [f"lost-{n:02}" for n in range(12)]
    for task_id in lost:
        watched.call(task_id, send_number=1, sent_s_ago=RESEND_AFTER_S * 1.5, left_s=30)

    with caplog.at_level(logging.INFO, logger="api.calls.call_watch"):
        await watched.watch.look()

    assert sorted(watched.sent_again) == lost
    (line,) = [r.getMessage() for r in caplog.records if r.name == "api.calls.call_watch"]
    assert line.startswith("sent 12 call(s) again that no worker started, the 'sandbox' queue")
    assert line.endswith(f"{', '.join(lost[:SHOWN_TASK_IDS])} and {12 - SHOWN_TASK_IDS} more")
