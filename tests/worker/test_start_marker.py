"""The start marker sent ahead of a call (``ResultStore.begin_ahead``), on a real Redis: its
answer read when the call is about to start, and the connection it used left clean for the
next command."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import redis

from tests.conftest import RedisServer
from worker.contract.keys import keys
from worker.contract.wire import ToolCallResult
from worker.results import ResultStore

WORKER = "marker-test:1"


@pytest.fixture
def client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url)
    yield client
    client.close()


def task() -> str:
    return f"marker-{uuid.uuid4().hex}"


def test_the_first_delivery_marks_the_call_and_a_second_finds_it_cut(
    store: ResultStore, client: redis.Redis
) -> None:
    task_id = task()
    first = store.begin_ahead(task_id, WORKER)
    assert first.result().stored is None and first.result().previous is None
    assert client.get(keys.started(task_id)) == f"1 {WORKER}".encode()
    assert store.begin_ahead(task_id, "other-worker:2").result().previous == WORKER


def test_a_finished_call_is_found_with_its_answer(store: ResultStore) -> None:
    task_id = task()
    answer = ToolCallResult(task_id=task_id, tool="run_bash", output="done", worker=WORKER)
    kept = store.store(answer, None)
    assert kept.output == "done" and kept == store.sealed(answer)
    assert store.begin_ahead(task_id, "other-worker:2").result().stored == kept


def test_a_server_that_forgot_the_script_still_answers(
    store: ResultStore, client: redis.Redis
) -> None:
    client.script_flush()
    assert store.begin_ahead(task(), WORKER).result().previous is None
    assert store.begin_ahead(task(), WORKER).result().previous is None  # loaded again by the first


def test_a_discarded_begin_leaves_no_answer_for_the_next_command(
    store: ResultStore, client: redis.Redis
) -> None:
    client.set("marker-test:key", "value")
    pending = store.begin_ahead(task(), WORKER)
    pending.discard()
    # The pool hands the same connection out next: its unread answer must be gone with it.
    assert client.get("marker-test:key") == b"value"
    assert client.get("marker-test:key") == b"value"
