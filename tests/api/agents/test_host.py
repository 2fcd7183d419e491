"""An agents worker process's host, in this process: conversations run on its loop from any
thread, and one whose lease goes to another run stops here without answering."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from api.agents.host import ConversationHost
from api.agents.messages import LEASE_RENEW_S, ConversationRequest, ConversationResult
from api.agents.messages import conversation_keys as k
from api.scripted.server import ScriptedServer
from tests.conftest import WorkerFleet, orchestrator_settings, scripted_server, wait_for

pytestmark = pytest.mark.integration

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


def message(script: str, reply_to: str) -> dict[str, Any]:
    cid = f"host-{uuid.uuid4().hex[:12]}"
    return ConversationRequest(
        task_id=f"{cid}:1",
        conversation_id=cid,
        item={"id": "q", "prompt": "p", "model": f"scripted:{script}"},
        timeout_s=60,
        reply_to=reply_to,
    ).model_dump(mode="json")


def test_a_conversation_runs_on_the_host_and_answers_its_caller(
    host: ConversationHost, fleet: WorkerFleet
) -> None:
    client = redis.Redis.from_url(fleet.settings.redis_url)
    reply_to = f"toolq:reply:{uuid.uuid4().hex}"
    sent = message("note", reply_to)

    host.run(sent)

    raw = client.lpop(reply_to)
    assert raw is not None
    result = ConversationResult.model_validate_json(raw)  # type: ignore[arg-type]
    assert (result.attempt, result.worker) == (1, host.name)
    assert result.record["status"] == "ok", result.record["error"]
    assert result.record["answer"] == "written"
    assert result.record["tool_calls"][0]["worker"] != "orchestrator"
    assert (Path(fleet.settings.workspace_root) / sent["conversation_id"] / "n.txt").exists()
    assert not client.exists(k.lease(sent["conversation_id"]))
    client.close()


def test_a_conversation_whose_lease_is_taken_stops_without_an_answer(
    host: ConversationHost, fleet: WorkerFleet
) -> None:
    client = redis.Redis.from_url(fleet.settings.redis_url)
    reply_to = f"toolq:reply:{uuid.uuid4().hex}"
    sent = message("stall", reply_to)
    cid = sent["conversation_id"]
    running = threading.Thread(target=host.run, args=(sent,))
    running.start()
    wait_for(lambda: host.running == 1, 10, "the conversation to start")
    client.set(k.lease(cid), "2 elsewhere:1", ex=60)  # another run has it now

    running.join(timeout=LEASE_RENEW_S + 10)

    assert not running.is_alive()
    assert host.running == 0
    assert client.llen(reply_to) == 0
    assert not client.exists(k.result(cid))
    assert client.get(k.lease(cid)) == b"2 elsewhere:1"
    client.close()
