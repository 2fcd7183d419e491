"""An agents worker process's host, in this process: conversations run on its loop from any
thread, one whose lease goes to another run stops here without answering, and a run of the HTTP
API writes its events to the run's record and stops when asked to cancel."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aioredis

from api.agents.host import ConversationHost
from api.agents.messages import LEASE_RENEW_S, ConversationRequest, ConversationResult
from api.scripted.server import ScriptedServer
from api.state.store import ApiStore
from tests.conftest import WorkerFleet, orchestrator_settings, scripted_server, wait_for
from worker.contract.keys import conversation_keys as k

pytestmark = pytest.mark.integration

T = TypeVar("T")

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "note": [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "n.txt", "content": "x"}}]},
        {"content": "written"},
    ],
    "stall": [{"content": "late", "fault": {"kind": "stall", "seconds": 30}}],
}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedServer]:
    with scripted_server(tmp_path_factory.mktemp("host-scripts"), SCRIPTS) as server:
        yield server


@pytest.fixture
def host(
    fleet: WorkerFleet, model: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> Iterator[ConversationHost]:
    monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    made = ConversationHost(orchestrator_settings(fleet.settings))
    yield made
    made.close()


@pytest.fixture
def client(fleet: WorkerFleet) -> Iterator[redis.Redis]:
    made = redis.Redis.from_url(fleet.settings.redis_url)
    yield made
    made.close()


def message(script: str) -> dict[str, Any]:
    """A conversation of the batch, sent as a caller sends it, to be answered on its own list."""
    cid = f"host-{uuid.uuid4().hex[:12]}"
    return ConversationRequest(
        task_id=f"{cid}:1",
        conversation_id=cid,
        item={"id": "q", "prompt": "p", "model": f"scripted:{script}"},
        timeout_s=60,
        reply_to=f"toolq:reply:{uuid.uuid4().hex}",
    ).model_dump(mode="json")


def test_a_conversation_runs_on_the_host_and_answers_its_caller(
    host: ConversationHost, fleet: WorkerFleet, client: redis.Redis
) -> None:
    sent = message("note")

    host.run(sent)

    raw = client.lpop(sent["reply_to"])
    assert raw is not None
    result = ConversationResult.model_validate_json(raw)  # type: ignore[arg-type]
    assert (result.attempt, result.worker) == (1, host.name)
    assert result.record["status"] == "ok", result.record["error"]
    assert result.record["answer"] == "written"
    assert result.record["tool_calls"][0]["worker"] != "orchestrator"
    assert (Path(fleet.settings.workspace_root) / sent["conversation_id"] / "n.txt").exists()
    assert not client.exists(k.lease(sent["conversation_id"]))


def test_a_conversation_whose_lease_is_taken_stops_without_an_answer(
    host: ConversationHost, client: redis.Redis
) -> None:
    sent = message("stall")
    cid = sent["conversation_id"]
    running = threading.Thread(target=host.run, args=(sent,))
    running.start()
    wait_for(lambda: host.running == 1, 10, "the conversation to start")
    client.set(k.lease(cid), "2 elsewhere:1", ex=60)  # another run has it now

    running.join(timeout=LEASE_RENEW_S + 10)

    assert not running.is_alive()
    assert host.running == 0
    assert client.llen(sent["reply_to"]) == 0
    assert not client.exists(k.result(cid))
    assert client.get(k.lease(cid)) == b"2 elsewhere:1"


def live_run(fleet: WorkerFleet, script: str) -> dict[str, Any]:
    """A run of the HTTP API as its replica sends it: recorded in the store, running."""
    run_id = f"run-{uuid.uuid4().hex}"
    options = {"model": f"scripted:{script}", "run_id": run_id}
    prompt = f"p {run_id}"  # the scripted model plays faults once per conversation it tells apart

    async def create(store: ApiStore) -> None:
        await store.create_run(run_id, prompt, options, "replica-under-test")
        await store.renew_lease("replica-under-test")  # its replica is alive
        assert await store.mark_running(run_id)

    on_store(fleet, create)
    return ConversationRequest(
        task_id=f"{run_id}:1",
        conversation_id=run_id,
        run={"prompt": prompt, "options": options},
        timeout_s=60,
        reply_to=f"toolq:reply:{uuid.uuid4().hex}",
    ).model_dump(mode="json")


def on_store(fleet: WorkerFleet, action: Callable[[ApiStore], Awaitable[T]]) -> T:
    """``action`` on the API's store of the fleet's Redis, from this synchronous test."""

    async def run() -> T:
        store = ApiStore(aioredis.Redis.from_url(fleet.settings.redis_url), retention_s=600)
        try:
            return await action(store)
        finally:
            await store.redis.aclose()

    return asyncio.run(run())


async def events_of(store: ApiStore, run_id: str) -> list[dict[str, Any]]:
    return [event for _, event in await store.read_events(run_id, "0", block_ms=0)]


def answer(client: redis.Redis, sent: dict[str, Any]) -> dict[str, Any]:
    raw = client.lpop(sent["reply_to"])
    assert raw is not None
    return ConversationResult.model_validate_json(raw).record  # type: ignore[arg-type]


def test_a_run_of_the_http_api_writes_its_events_and_transcript_and_answers_its_end(
    host: ConversationHost, fleet: WorkerFleet, client: redis.Redis
) -> None:
    sent = live_run(fleet, "note")
    run_id = sent["conversation_id"]

    host.run(sent)

    ended = answer(client, sent)
    assert ended["status"] == "succeeded", ended["error"]
    assert (ended["answer"], ended["stop_reason"]) == ("written", "answered")
    assert (ended["attempts"], ended["orchestrator"]) == (1, host.name)
    assert [c["name"] for c in ended["tool_calls"]] == ["write_file"]
    events = on_store(fleet, lambda store: events_of(store, run_id))
    kinds = [event["type"] for event in events]
    assert kinds == ["tool_call_started", "tool_call_finished", "text_delta", "final_answer"]
    state = on_store(fleet, lambda store: store.get_run(run_id))
    assert state is not None and state.transcript is not None
    assert state.status == "running"  # its replica records the end
    assert [c["name"] for c in state.transcript["tool_calls"]] == ["write_file"]
    assert state.transcript["messages"][-1]["content"] == "written"


def test_a_run_started_again_tells_its_followers_the_earlier_text_is_void(
    host: ConversationHost, fleet: WorkerFleet, client: redis.Redis
) -> None:
    sent = live_run(fleet, "note")
    run_id = sent["conversation_id"]
    client.set(k.attempts(run_id), 1)  # an agents worker died running it once

    host.run(sent)

    ended = answer(client, sent)
    assert (ended["status"], ended["attempts"]) == ("succeeded", 2)
    assert on_store(fleet, lambda store: events_of(store, run_id))[0] == {
        "type": "text_discarded",
        "reason": "the agents worker running it stopped; it runs again from the start (2)",
    }


def test_a_run_asked_to_cancel_stops_on_the_agents_worker(
    host: ConversationHost, fleet: WorkerFleet, client: redis.Redis
) -> None:
    sent = live_run(fleet, "stall")
    running = threading.Thread(target=host.run, args=(sent,))
    running.start()
    wait_for(lambda: host.running == 1, 10, "the run to start")

    outcome = on_store(fleet, lambda store: store.request_cancel(sent["conversation_id"]))
    assert outcome == "cancelling"
    running.join(timeout=10)  # the model stalls for 30 s: only the cancel ends it this soon

    assert not running.is_alive()
    ended = answer(client, sent)
    assert (ended["status"], ended["error"]) == ("cancelled", "cancelled on request")
