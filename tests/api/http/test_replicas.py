"""Two `toolq serve` replicas on real workers and a scripted model, sharing state in Redis."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from prometheus_client.parser import text_string_to_metric_families

from api.agents.messages import ConversationResult
from api.calls.fleet import FLEET_TTL_S
from api.http.runner import SHUTDOWN_ERROR
from api.scripted.server import ScriptedServer
from tests.api.http.serving import Replica, serve_environment, two_replicas
from tests.conftest import AgentsWorker, WorkerFleet, wait_for
from worker.contract.keys import conversation_keys as k

pytestmark = pytest.mark.integration

TOKEN = "integration-token"
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "notes": [
        {
            "content": "Saving your words to a file first.",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "note.txt", "content": "{prompt}"}}
            ],
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
        {"content": "The note says: {last_tool_result}"},
    ],
    "answer": [{"content": "A plain answer, with no tools at all."}],
    "stall": [{"content": "too late", "fault": {"kind": "stall", "seconds": 60}}],
}


@pytest.fixture(scope="module")
def replicas(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Replica, Replica]]:
    env = serve_environment(fleet, model, TOKEN)
    logs = tmp_path_factory.mktemp("api-logs")
    with two_replicas(env, logs, TOKEN) as started:
        yield started


def sample(text: str, name: str, **labels: str) -> float:
    for family in text_string_to_metric_families(text):
        for found in family.samples:
            if found.name == name and found.labels == labels:
                return float(found.value)
    raise AssertionError(f"no sample {name}{labels} in:\n{text}")


def test_a_run_started_on_one_replica_is_followed_from_the_other(
    replicas: tuple[Replica, Replica], fleet: WorkerFleet
) -> None:
    a, b = replicas
    prompt = f"remember {uuid.uuid4().hex}"
    run_id = a.create_run("notes", prompt)

    events = b.events(run_id)  # streams live, and ends with the run
    kinds = [e["type"] for e in events]
    assert kinds.count("text_delta") > 2
    assert [(e["type"], e["name"]) for e in events if e["type"].startswith("tool_call")] == [
        ("tool_call_started", "write_file"),
        ("tool_call_finished", "write_file"),
        ("tool_call_started", "read_file"),
        ("tool_call_finished", "read_file"),
    ]
    assert kinds[-2:] == ["final_answer", "done"]
    assert events[-2]["text"] == f"The note says: {prompt}"
    assert events[-1]["status"] == "succeeded"
    text = "".join(e["text"] for e in events if e["type"] == "text_delta")
    assert text.startswith("Saving your words to a file first.")

    run = b.run(run_id)
    assert run["status"] == "succeeded"
    assert run["replica"] == a.replica_id
    assert run["answer"] == f"The note says: {prompt}"
    calls = run["transcript"]["tool_calls"]
    assert [c["name"] for c in calls] == ["write_file", "read_file"]
    assert all(c["worker"] and not c["is_error"] for c in calls)
    assert (Path(fleet.settings.workspace_root) / run_id / "note.txt").read_text() == prompt
    assert a.events(run_id) == events  # a late reader gets the same events again


def test_a_run_is_cancelled_through_the_other_replica(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    run_id = a.create_run("stall")
    b.wait_status(run_id, "running")
    response = b.client.post(f"/v1/runs/{run_id}/cancel")
    assert response.status_code == 200, response.text
    assert response.json() == {"id": run_id, "status": "cancelled"}
    run = a.run(run_id)
    assert run["status"] == "cancelled"
    assert run["error"] == "cancelled on request"
    assert a.events(run_id)[-1] == {
        "type": "done",
        "status": "cancelled",
        "error": "cancelled on request",
        "stop_reason": None,
    }
    assert b.client.post(f"/v1/runs/{run_id}/cancel").status_code == 409


def test_a_batch_reports_progress_and_every_result(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    items = [
        {"id": "first", "prompt": f"one {uuid.uuid4().hex}", "model": "scripted:notes"},
        {"id": "second", "prompt": f"two {uuid.uuid4().hex}", "model": "scripted:notes"},
        {"id": "plain", "prompt": "three"},
    ]
    response = b.client.post(
        "/v1/batches", json={"items": items, "concurrency": 2, "model": "scripted:answer"}
    )
    assert response.status_code == 202, response.text
    batch_id = response.json()["id"]

    def finished() -> bool:
        return bool(a.client.get(f"/v1/batches/{batch_id}").json()["status"] == "succeeded")

    wait_for(finished, 60, "the batch to finish")
    batch = a.client.get(f"/v1/batches/{batch_id}").json()
    assert batch["progress"] == {"total": 3, "done": 3, "ok": 3, "error": 0, "running": 0}
    results = {r["id"]: r for r in batch["results"]}
    assert results["first"]["answer"] == f"The note says: {items[0]['prompt']}"
    assert results["second"]["answer"] == f"The note says: {items[1]['prompt']}"
    assert results["plain"]["answer"] == "A plain answer, with no tools at all."
    assert [c["name"] for c in results["first"]["tool_calls"]] == ["write_file", "read_file"]
    page = a.client.get(f"/v1/batches/{batch_id}", params={"offset": 2, "limit": 10}).json()
    assert len(page["results"]) == 1


@pytest.fixture
def agents(
    fleet: WorkerFleet, model: ScriptedServer, agents_workers: Callable[..., AgentsWorker]
) -> Iterator[AgentsWorker]:
    """An agents worker asking the module's model, one the replicas see: a replica reuses its
    view of the fleet FLEET_TTL_S, past it the next item sees the worker. After the test it is
    stopped as long, so that the next tests' runs run in the replicas again."""
    worker = agents_workers(fleet.settings, model.base_url)
    time.sleep(FLEET_TTL_S + 0.2)
    yield worker
    worker.stop()
    time.sleep(FLEET_TTL_S + 0.2)


def test_a_batch_goes_to_the_agents_pool_while_an_agents_worker_is_live(
    replicas: tuple[Replica, Replica], agents: AgentsWorker
) -> None:
    a, _ = replicas
    items = [{"id": f"n{n}", "prompt": f"note {uuid.uuid4().hex}"} for n in range(4)]
    response = a.client.post(
        "/v1/batches", json={"items": items, "concurrency": 4, "model": "scripted:notes"}
    )
    assert response.status_code == 202, response.text
    batch_id = response.json()["id"]
    wait_for(
        lambda: a.client.get(f"/v1/batches/{batch_id}").json()["status"] == "succeeded",
        60,
        f"the batch to finish:\n{agents.log_tail()}",
    )
    results = a.client.get(f"/v1/batches/{batch_id}").json()["results"]
    assert {r["orchestrator"] for r in results} == {agents.process_name}
    prompts = {item["id"]: item["prompt"] for item in items}
    assert {r["id"]: r["answer"] for r in results} == {
        item_id: f"The note says: {prompt}" for item_id, prompt in prompts.items()
    }
    assert {r["attempts"] for r in results} == {1}


def test_a_run_goes_to_the_agents_pool_and_stops_there_when_cancelled(
    replicas: tuple[Replica, Replica], fleet: WorkerFleet, agents: AgentsWorker
) -> None:
    a, b = replicas
    prompt = f"remember {uuid.uuid4().hex}"
    run_id = a.create_run("notes", prompt)

    events = b.events(run_id)  # written by the agents worker, the end by replica a
    assert [(e["type"], e.get("name")) for e in events if e["type"] != "text_delta"] == [
        ("tool_call_started", "write_file"),
        ("tool_call_finished", "write_file"),
        ("tool_call_started", "read_file"),
        ("tool_call_finished", "read_file"),
        ("final_answer", None),
        ("done", None),
    ]
    assert events[-1]["status"] == "succeeded"
    run = b.run(run_id)
    assert (run["status"], run["answer"]) == ("succeeded", f"The note says: {prompt}")
    assert (run["orchestrator"], run["attempts"]) == (agents.process_name, 1)
    assert [c["name"] for c in run["transcript"]["tool_calls"]] == ["write_file", "read_file"]
    assert (Path(fleet.settings.workspace_root) / run_id / "note.txt").read_text() == prompt

    stalled = a.create_run("stall")
    client = redis.Redis.from_url(fleet.settings.redis_url)
    wait_for(lambda: bool(client.exists(k.lease(stalled))), 30, "the agents worker to take the run")
    response = b.client.post(f"/v1/runs/{stalled}/cancel")
    assert response.json() == {"id": stalled, "status": "cancelled"}
    # The agents worker stopped it too: its conversation answered "cancelled" long before the
    # model's 60 s stall would have ended it.
    wait_for(
        lambda: bool(client.exists(k.result(stalled))), 10, "the agents worker to stop the run"
    )
    stored = ConversationResult.model_validate_json(client.get(k.result(stalled)))  # type: ignore[arg-type]
    assert stored.record["status"] == "cancelled"
    assert a.run(stalled)["status"] == "cancelled"
    client.close()


def test_tools_lists_the_fleet_with_its_live_workers(replicas: tuple[Replica, Replica]) -> None:
    tools = {t["name"]: t for t in replicas[0].client.get("/v1/tools").json()}
    assert {"read_file", "write_file", "run_bash", "noop", "get_current_weather"} <= set(tools)
    assert tools["run_bash"]["pool"] == "sandbox"
    assert tools["read_file"]["pool"] == "tools"
    assert tools["read_file"]["live_workers"] >= 1
    assert tools["run_bash"]["live_workers"] >= 1
    assert "path" in tools["read_file"]["parameters"]["properties"]


def test_metrics_count_the_calls_and_runs_of_the_replica(
    replicas: tuple[Replica, Replica],
) -> None:
    a, _ = replicas
    a.wait_status(a.create_run("notes"), "succeeded")
    response = a.client.get("/metrics")
    assert response.status_code == 200
    text = response.text
    assert sample(text, "toolq_tool_calls_total", tool="write_file", outcome="ok") >= 1
    assert sample(text, "toolq_tool_calls_total", tool="read_file", outcome="ok") >= 1
    assert sample(text, "toolq_tool_call_seconds_count", tool="write_file") >= 1
    assert sample(text, "toolq_tool_call_seconds_bucket", tool="write_file", le="+Inf") >= 1
    assert sample(text, "toolq_runs_total", status="succeeded") >= 1
    assert sample(text, "toolq_queue_depth", pool="tools") >= 0
    assert sample(text, "toolq_queue_depth", pool="agents") >= 0
    assert sample(text, "toolq_tool_calls_in_flight") == 0
    assert a.client.get("/metrics", headers={"Authorization": ""}).status_code == 401


def test_a_restarted_replica_loses_no_finished_run(replicas: tuple[Replica, Replica]) -> None:
    a, b = replicas
    finished = a.create_run("notes")
    answer = a.wait_status(finished, "succeeded")["answer"]
    in_flight = a.create_run("stall")
    a.wait_status(in_flight, "running")

    a.stop()
    cut = b.run(in_flight)  # the stopping replica recorded why it ended
    assert cut["status"] == "failed"
    assert cut["error"] == SHUTDOWN_ERROR
    a.start()

    run = a.run(finished)
    assert run["status"] == "succeeded"
    assert run["answer"] == answer
    assert [e["type"] for e in a.events(finished)][-2:] == ["final_answer", "done"]
