"""Send a job, store its answer once, reply (``worker.plumbing.jobs``), on a real Redis: the first
answer stored wins, a run superseded stores nothing, each answer reaches the waiter of its job,
and a store refused for a while is tried again until the deadline."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from operator import attrgetter

import pytest
import redis
import redis.asyncio as aioredis
from pydantic import BaseModel
from redis.exceptions import OutOfMemoryError

from tests.conftest import RedisServer
from tests.worker.test_store_refusals import PATIENT_S, refuse_writes, take_writes, while_refused
from worker.plumbing.jobs.answers import AnswerStore, AsyncAnswerStore, RunGuard, Stored
from worker.plumbing.jobs.replies import ReplyReader

TTL_S = 60


def result_key(job_id: str) -> str:
    return f"jobs-test:{job_id}:answer"


def unique(name: str) -> str:
    return f"{name}-{uuid.uuid4().hex}"


@pytest.fixture
async def async_client(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    client = aioredis.Redis.from_url(redis_server.url)
    yield client
    await client.aclose()


@pytest.fixture
def answers(redis_client: redis.Redis) -> AnswerStore:
    return AnswerStore(redis_client, TTL_S, result_key, "job")


def test_the_first_answer_stored_wins_and_only_it_is_pushed(
    answers: AnswerStore, redis_client: redis.Redis
) -> None:
    job, reply_to = unique("job"), unique("reply")

    assert answers.store_once(job, "first", reply_to) == Stored("stored")
    # A run that ends later (a redelivery) gets the first answer back, pushed to nobody.
    assert answers.store_once(job, "second", reply_to) == Stored("kept", b"first")

    assert redis_client.get(result_key(job)) == b"first"
    assert redis_client.lrange(reply_to, 0, -1) == [b"first"]
    assert 0 < redis_client.ttl(result_key(job)) <= TTL_S
    assert 0 < redis_client.ttl(reply_to) <= TTL_S


def test_a_kept_value_named_as_not_the_jobs_own_is_replaced(
    answers: AnswerStore, redis_client: redis.Redis
) -> None:
    job, reply_to = unique("job"), unique("reply")
    redis_client.set(result_key(job), "planted")

    assert answers.store_once(job, "real", reply_to, replacing=b"planted") == Stored("stored")
    assert redis_client.get(result_key(job)) == b"real"
    assert redis_client.lrange(reply_to, 0, -1) == [b"real"]


def test_an_answer_without_a_reply_list_is_stored_only(
    answers: AnswerStore, redis_client: redis.Redis
) -> None:
    job = unique("job")
    assert answers.store_once(job, "quiet", None) == Stored("stored")
    assert redis_client.get(result_key(job)) == b"quiet"


def test_a_kept_answer_is_sent_again_on_request(
    answers: AnswerStore, redis_client: redis.Redis
) -> None:
    reply_to = unique("reply")
    answers.reply("job", b"kept", reply_to)
    answers.reply("job", b"ignored", None)
    assert redis_client.lrange(reply_to, 0, -1) == [b"kept"]
    assert 0 < redis_client.ttl(reply_to) <= TTL_S


@dataclass
class RunOfSend1:
    """A job of its own whose run as its ``send-1`` holds lease ``1 host:a`` and stores its
    answers through ``answers``."""

    client: aioredis.Redis
    answers: AsyncAnswerStore
    job: str = field(default_factory=lambda: unique("job"))
    reply_to: str = field(default_factory=lambda: unique("reply"))

    async def guard(self, current: str, lease: str) -> RunGuard:
        """The run's guard, with Redis naming ``current`` the job's current send and ``lease``
        the holder of its lease."""
        key = result_key(self.job)
        guard = RunGuard(f"{key}:current", "send-1", f"{key}:lease", "1 host:a")
        await self.client.set(guard.current_key, current)
        await self.client.set(guard.lease_key, lease)
        return guard

    async def store(self, answer: str, guard: RunGuard) -> Stored:
        return await self.answers.store_once(self.job, answer, self.reply_to, guard=guard)


@pytest.fixture
def run(async_client: aioredis.Redis) -> RunOfSend1:
    return RunOfSend1(async_client, AsyncAnswerStore(async_client, TTL_S, result_key))


async def test_a_run_of_a_superseded_send_stores_nothing_and_lets_its_lease_go(
    run: RunOfSend1,
) -> None:
    old = await run.guard(current="send-2", lease="1 host:a")

    assert await run.store("late", old) == Stored("superseded", b"send-2")
    assert not await run.client.exists(result_key(run.job), run.reply_to, old.lease_key)


async def test_the_current_send_stores_its_answer_and_keeps_a_lease_not_its_own(
    run: RunOfSend1,
) -> None:
    # The lease is held by the run after this one.
    current = await run.guard(current="send-1", lease="2 host:b")

    assert await run.store("answer", current) == Stored("stored")
    assert await run.store("again", current) == Stored("kept", b"answer")
    assert await run.client.lrange(run.reply_to, 0, -1) == [b"answer"]
    assert await run.client.get(current.lease_key) == b"2 host:b"


class Answer(BaseModel):
    job: str
    text: str


@dataclass
class Waiting:
    answer: asyncio.Future[str] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


async def test_each_answer_reaches_the_waiter_of_its_job(async_client: aioredis.Redis) -> None:
    reply_to = unique("reply")
    waiting = {"a": Waiting(), "b": Waiting()}
    malformed: list[bytes | str] = []
    reader: ReplyReader[Answer, Waiting] = ReplyReader(
        async_client,
        reply_to,
        Answer,
        waiting,
        attrgetter("job"),
        lambda waiter, answer: waiter.answer.set_result(answer.text),
        malformed=malformed.append,
    )
    reader.start("jobs-test-replies")
    try:
        pushed = [
            Answer(job="gone", text="nobody waits").model_dump_json(),
            "not an answer",
            Answer(job="b", text="for b").model_dump_json(),
            Answer(job="a", text="for a").model_dump_json(),
            Answer(job="a", text="a second answer, dropped").model_dump_json(),
        ]
        await async_client.rpush(reply_to, *pushed)
        texts = await asyncio.wait_for(asyncio.gather(*(w.answer for w in waiting.values())), 10)
    finally:
        await reader.stop()
    assert texts == ["for a", "for b"]
    assert malformed == [b"not an answer"]
    assert not reader.started
    assert await async_client.llen(reply_to) == 0


@pytest.mark.integration
def test_an_answer_refused_for_a_while_is_stored_once_the_store_takes_writes(
    own_redis_client: redis.Redis,
) -> None:
    answers = AnswerStore(own_redis_client, TTL_S, result_key, "job")
    deadline = time.time() + PATIENT_S

    stored = while_refused(
        own_redis_client,
        lambda: answers.store_once("refused", "answer", "reply", deadline=deadline),
    )

    assert stored == Stored("stored")
    assert own_redis_client.lrange("reply", 0, -1) == [b"answer"]


@pytest.mark.integration
def test_an_answer_refused_past_its_deadline_is_given_up(own_redis_client: redis.Redis) -> None:
    answers = AnswerStore(own_redis_client, TTL_S, result_key, "job")
    refuse_writes(own_redis_client)
    started = time.monotonic()
    try:
        with pytest.raises(OutOfMemoryError):
            answers.store_once("late", "answer", "reply", deadline=time.time() + 0.3)
    finally:
        take_writes(own_redis_client)
    assert 0.3 <= time.monotonic() - started < 5
    assert not own_redis_client.exists(result_key("late"))
