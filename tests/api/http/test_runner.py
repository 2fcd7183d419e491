"""Runs and batches executed for real in the API process, on a scripted model.

The fleet view is fixed and no run calls a tool, so no worker is needed.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, cast

import fakeredis
import httpx
import pytest
from fastapi import FastAPI
from openai import AsyncOpenAI
from prometheus_client.parser import text_string_to_metric_families

from api.calls.dispatch import Dispatcher
from api.http.app import create_app
from api.http.metrics import ApiMetrics
from api.http.runner import SHUTDOWN_ERROR, AgentExecutor, RunExecutor, RunExecutorFactory
from api.model.client import ChatModel, RetryPolicy
from api.scripted.server import ScriptedServer
from api.settings import OrchestratorSettings
from api.state.store import ApiStore
from tests.api.http.conftest import (
    FLEET,
    StubExecutor,
    api_settings,
    fake_redis,
    serving,
    sse_events,
)


class IdleDispatcher:
    """Stands in for the dispatcher of runs that never call a tool."""

    def __init__(self) -> None:
        # What a run's items hand the dispatcher for their calls (network, limits).
        self.networks: dict[str, Any] = {}
        self.limits: dict[str, Any] = {}

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


#: Tool names a model made up: each is answered "unknown tool" without reaching a worker.
INVENTED_TOOLS = [f"invented_tool_{n}" for n in range(50)]

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "answer": [{"content": "The answer, streamed in small pieces, is 42."}],
    "inventive": [
        {"tool_calls": [{"name": name, "arguments": {}} for name in INVENTED_TOOLS]},
        {"content": "None of those exist."},
    ],
    "stall": [{"content": "too late", "fault": {"kind": "stall", "seconds": 60}}],
    "refused": [{"content": "never", "fault": {"kind": "status", "status": 400}}],
}


def real_executor(server: ScriptedServer, settings: OrchestratorSettings) -> RunExecutorFactory:
    def make(store: ApiStore, metrics: ApiMetrics, replica: str) -> RunExecutor:
        client = AsyncOpenAI(base_url=server.base_url, api_key="test", max_retries=0, timeout=90)
        return AgentExecutor(
            settings,
            store,
            metrics,
            ChatModel(client, RetryPolicy(attempts=1)),
            replica=replica,
            dispatcher=cast(Dispatcher, IdleDispatcher()),
            fleet_loader=lambda _: FLEET,
            cancel_poll_s=0.2,
        )

    return make


@pytest.fixture
def live_app(model: ScriptedServer, fake_server: fakeredis.FakeServer) -> FastAPI:
    settings = api_settings()
    return create_app(
        settings,
        redis=fake_redis(fake_server),
        executor=real_executor(model, settings),
        queue_depths=lambda _: {"tools": 0, "sandbox": 0},
    )


def ask(script: str) -> dict[str, Any]:
    """A run on a script; a prompt of its own, as the model's faults count per conversation."""
    return {"prompt": f"question {uuid.uuid4().hex}", "options": {"model": f"scripted:{script}"}}


async def status_of(api: httpx.AsyncClient, run_id: str) -> str:
    status: str = (await api.get(f"/v1/runs/{run_id}")).json()["status"]
    return status


async def run_to_its_end(
    api: httpx.AsyncClient, script: str
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Start a run on ``script``, follow its events to ``done``; the events and the run then."""
    run_id = (await api.post("/v1/runs", json=ask(script))).json()["id"]
    events = sse_events((await api.get(f"/v1/runs/{run_id}/events")).text)
    run: dict[str, Any] = (await api.get(f"/v1/runs/{run_id}")).json()
    return events, run


async def test_a_run_streams_its_answer_and_keeps_its_transcript(live_app: FastAPI) -> None:
    async with serving(live_app) as api:
        events, run = await run_to_its_end(api, "answer")
        metrics = (await api.get("/metrics")).text

    text = "".join(e["text"] for e in events if e["type"] == "text_delta")
    assert text == "The answer, streamed in small pieces, is 42."
    assert len([e for e in events if e["type"] == "text_delta"]) > 1
    assert [e["type"] for e in events[-2:]] == ["final_answer", "done"]
    assert run["status"] == "succeeded"
    assert run["answer"] == text
    assert run["stop_reason"] == "answered"
    assert run["usage"]["total_tokens"] > 0
    assert [m["role"] for m in run["transcript"]["messages"]] == ["system", "user", "assistant"]
    assert 'toolq_runs_total{status="succeeded"} 1.0' in metrics


async def test_tools_a_model_invents_are_counted_under_one_unknown_series(
    live_app: FastAPI,
) -> None:
    async with serving(live_app) as api:
        _, run = await run_to_its_end(api, "inventive")
        metrics = (await api.get("/metrics")).text

    assert run["status"] == "succeeded"
    calls = run["transcript"]["tool_calls"]
    assert sorted(c["name"] for c in calls) == sorted(INVENTED_TOOLS)
    assert {c["error_kind"] for c in calls} == {"unknown_tool"}
    series = [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(metrics)
        for sample in family.samples
        if sample.name == "toolq_tool_calls_total"
    ]
    assert series == [({"tool": "unknown", "outcome": "unknown_tool"}, 50.0)]
    assert not any(name in metrics for name in INVENTED_TOOLS)


async def test_a_model_that_refuses_fails_the_run_with_its_reason(live_app: FastAPI) -> None:
    async with serving(live_app) as api:
        events, run = await run_to_its_end(api, "refused")
    assert events[-1]["status"] == "failed"
    assert run["status"] == "failed"
    assert "model API failed" in run["error"] and "400" in run["error"]


async def test_a_running_run_is_cancelled_on_request(live_app: FastAPI) -> None:
    async with serving(live_app) as api:
        created = await api.post("/v1/runs", json=ask("stall"))
        run_id = created.json()["id"]

        async def running() -> bool:
            return await status_of(api, run_id) == "running"

        await until(running, "the run to start")
        cancelled = await api.post(f"/v1/runs/{run_id}/cancel")
        run = (await api.get(f"/v1/runs/{run_id}")).json()
        events = sse_events((await api.get(f"/v1/runs/{run_id}/events")).text)
        again = await api.post(f"/v1/runs/{run_id}/cancel")
    assert cancelled.status_code == 200
    assert cancelled.json()["status"] == "cancelled"
    assert run["status"] == "cancelled"
    assert run["error"] == "cancelled on request"
    assert events[-1] == {**events[-1], "type": "done", "status": "cancelled"}
    assert again.status_code == 409


async def test_shutting_down_fails_the_runs_in_flight_and_keeps_finished_ones(
    model: ScriptedServer, fake_server: fakeredis.FakeServer
) -> None:
    settings = api_settings()
    first = create_app(
        settings, redis=fake_redis(fake_server), executor=real_executor(model, settings)
    )
    async with serving(first) as api:
        done = (await api.post("/v1/runs", json=ask("answer"))).json()["id"]
        stalled = (await api.post("/v1/runs", json=ask("stall"))).json()["id"]

        async def settled() -> bool:
            return (
                await status_of(api, done) == "succeeded"
                and await status_of(api, stalled) == "running"
            )

        await until(settled, "one run to finish and one to stall")

    second = create_app(settings, redis=fake_redis(fake_server), executor=lambda *_: StubExecutor())
    async with serving(second) as api:
        finished = (await api.get(f"/v1/runs/{done}")).json()
        cut = (await api.get(f"/v1/runs/{stalled}")).json()
    assert finished["status"] == "succeeded"
    assert finished["answer"].endswith("is 42.")
    assert cut["status"] == "failed"
    assert cut["error"] == SHUTDOWN_ERROR


async def test_a_batch_runs_every_item_and_reports_each_result(live_app: FastAPI) -> None:
    items = [
        {"id": "good", "prompt": "good?", "model": "scripted:answer"},
        {"id": "bad", "prompt": "bad?", "model": "scripted:refused"},
        {"id": "default", "prompt": "default?"},
    ]
    async with serving(live_app) as api:
        created = await api.post(
            "/v1/batches", json={"items": items, "concurrency": 2, "model": "scripted:answer"}
        )
        batch_id = created.json()["id"]

        async def finished() -> bool:
            batch = (await api.get(f"/v1/batches/{batch_id}")).json()
            return bool(batch["status"] == "succeeded")

        await until(finished, "the batch to finish")
        batch = (await api.get(f"/v1/batches/{batch_id}")).json()
    assert batch["progress"] == {"total": 3, "done": 3, "ok": 2, "error": 1, "running": 0}
    results = {r["id"]: r for r in batch["results"]}
    assert results["good"]["answer"].endswith("is 42.")
    assert results["default"]["answer"].endswith("is 42.")
    assert results["bad"]["status"] == "error"
    assert "400" in results["bad"]["error"]
