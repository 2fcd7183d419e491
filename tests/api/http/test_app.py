"""The HTTP API in process: auth, validation, limits, run and batch state, SSE, cancellation.

Redis is fakeredis; runs execute either nowhere (a stub executor, to look at the HTTP surface)
or on the real executor against a scripted model and a fleet view whose tools are never called.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import fakeredis
import httpx
import pytest
from fastapi import FastAPI
from openai import AsyncOpenAI

from api.agent import AgentOptions
from api.batch.items import BatchItem
from api.dispatch import Dispatcher
from api.fleet import Fleet
from api.http.app import create_app, serve
from api.http.auth import is_loopback
from api.http.metrics import ApiMetrics
from api.http.runner import SHUTDOWN_ERROR, AgentExecutor, Executor, ExecutorFactory
from api.http.state import ApiStore
from api.llm import ChatModel, RetryPolicy
from api.local.stack import free_port
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from api.settings import OrchestratorSettings
from worker.protocol import Pool, ToolSpec, WorkerInfo

TOKEN = "correct-horse-battery-staple"
AUTH = {"Authorization": f"Bearer {TOKEN}"}
BODY_LIMIT = 64 * 1024


def tool(name: str, pool: Pool = "tools", enabled: bool = True) -> ToolSpec:
    return ToolSpec(
        name=name,
        description=f"{name} for tests",
        parameters={"type": "object", "properties": {}},
        pool=pool,
        enabled_by_default=enabled,
        idempotent=True,
        default_timeout_ms=1000,
    )


FLEET = Fleet(
    tools={"read_file": tool("read_file"), "run_bash": tool("run_bash", "sandbox", False)},
    workers={
        "tools": [WorkerInfo(worker="tools@test", pools=["tools"], host="test", pid=1, started=0)],
        "sandbox": [],
    },
)


def api_settings(**overrides: Any) -> OrchestratorSettings:
    values: dict[str, Any] = {
        "broker_url": "redis://127.0.0.1:1/0",
        "api_token": TOKEN,
        "api_max_body_bytes": BODY_LIMIT,
    }
    values.update(overrides)
    return OrchestratorSettings(**values)


class StubExecutor:
    """Takes runs and batches and executes nothing."""

    def __init__(self, fleet: Fleet = FLEET) -> None:
        self._fleet = fleet
        self.runs: list[tuple[str, str, AgentOptions]] = []
        self.batches: list[tuple[str, list[BatchItem], int]] = []

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def fleet(self) -> Fleet:
        return self._fleet

    def submit_run(self, run_id: str, prompt: str, options: AgentOptions) -> None:
        self.runs.append((run_id, prompt, options))

    def submit_batch(
        self,
        batch_id: str,
        items: Sequence[BatchItem],
        concurrency: int,
        default_model: str | None = None,
    ) -> None:
        self.batches.append((batch_id, list(items), concurrency))


class IdleDispatcher:
    """Stands in for the dispatcher of runs that never call a tool."""

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass


@asynccontextmanager
async def serving(app: FastAPI, headers: dict[str, str] = AUTH) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://toolq", headers=headers) as client,
    ):
        yield client


@pytest.fixture
def redis_server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


def fake_redis(server: fakeredis.FakeServer) -> fakeredis.FakeAsyncRedis:
    return fakeredis.FakeAsyncRedis(server=server)


@pytest.fixture
def stub() -> StubExecutor:
    return StubExecutor()


@pytest.fixture
def app(redis_server: fakeredis.FakeServer, stub: StubExecutor) -> FastAPI:
    return create_app(api_settings(), redis=fake_redis(redis_server), executor=lambda *_: stub)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(app) as api:
        yield api


def sse_events(text: str) -> list[dict[str, Any]]:
    """The data of each event of an SSE body, with its id and event name added."""
    events = []
    for block in text.split("\n\n"):
        fields = dict(
            line.split(": ", 1) for line in block.splitlines() if line and not line.startswith(":")
        )
        if "data" in fields:
            event = json.loads(fields["data"])
            assert fields["event"] == event["type"]
            events.append({"_id": fields["id"], **event})
    return events


async def until(check: Callable[[], Awaitable[bool]], what: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if await check():
            return
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


# --- Authentication ------------------------------------------------------------------------------

GUARDED = [
    ("GET", "/v1/tools"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs/run-x"),
    ("GET", "/v1/runs/run-x/events"),
    ("POST", "/v1/runs/run-x/cancel"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches/batch-x"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
]


@pytest.mark.parametrize(("method", "path"), GUARDED)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-the-token"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_every_route_but_health_needs_the_token(
    client: httpx.AsyncClient, stub: StubExecutor, method: str, path: str, headers: dict[str, str]
) -> None:
    client.headers.pop("Authorization")
    body = {"prompt": "hi"} if method == "POST" else None
    response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "TOOLQ_API_TOKEN" in response.json()["detail"]
    assert stub.runs == []


async def test_the_right_token_is_let_in_and_health_needs_none(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/tools")).status_code == 200
    health = await client.get("/healthz", headers={"Authorization": ""})
    assert health.status_code == 200
    assert health.json()["redis"] is True


async def test_without_a_configured_token_the_api_is_open(
    redis_server: fakeredis.FakeServer,
) -> None:
    app = create_app(
        api_settings(api_token=None),
        redis=fake_redis(redis_server),
        executor=lambda *_: StubExecutor(),
    )
    async with serving(app, headers={}) as api:
        assert (await api.get("/v1/tools")).status_code == 200


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_serve_refuses_a_reachable_address_without_a_token(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        serve(host, free_port(), settings=api_settings(api_token=None))
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert f"refusing to listen on {host}" in error
    assert "TOOLQ_API_TOKEN" in error


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("api.internal", False),
    ],
)
def test_only_loopback_addresses_count_as_private(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- Validation and limits -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({}, "prompt", "Field required"),
        ({"prompt": ""}, "prompt", "at least 1 character"),
        ({"prompt": "hi", "options": {"max_turns": 0}}, "options.max_turns", "greater than 0"),
        ({"prompt": "hi", "options": {"colour": "red"}}, "options.colour", "Extra inputs"),
        ({"prompt": "hi", "options": {"run_id": "../etc"}}, "options.run_id", "pattern"),
        ({"prompt": 7}, "prompt", "valid string"),
        ({"prompt": "hi", "stream": True}, "stream", "Extra inputs"),
        ({"prompt": "hi", "options": {"enable": ["nope"]}}, "options.enable.0", "'nope'"),
        ({"prompt": "hi", "options": {"disable": ["nope"]}}, "options.disable.0", "'nope'"),
        ({"prompt": "hi", "options": {"enable": ["run_bash"]}}, "options.enable.0", "'sandbox'"),
    ],
)
async def test_an_invalid_run_is_refused_naming_the_field_and_the_reason(
    client: httpx.AsyncClient,
    stub: StubExecutor,
    body: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    response = await client.post("/v1/runs", json=body)
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert [e["field"] for e in errors] == [field]
    assert reason in errors[0]["message"]
    assert f"{field}: " in response.json()["detail"]
    assert stub.runs == []


async def test_malformed_json_is_refused_with_a_clear_message(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/runs", content=b'{"prompt": "hi",', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]


async def test_a_body_declared_too_large_is_refused_before_it_is_read(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    response = await client.post("/v1/runs", json={"prompt": "a" * BODY_LIMIT})
    assert response.status_code == 413
    assert "TOOLQ_API_MAX_BODY_BYTES" in response.json()["detail"]
    assert stub.runs == []


async def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"prompt": "'
        for _ in range(4 * BODY_LIMIT // 1024):
            sent += 1024
            yield b"a" * 1024
        yield b'"}'

    response = await client.post(
        "/v1/runs", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert stub.runs == []


async def test_a_large_prompt_within_the_limit_is_accepted_whole(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    prompt = "word " * ((BODY_LIMIT - 200) // 5)
    response = await client.post("/v1/runs", json={"prompt": prompt})
    assert response.status_code == 202
    assert stub.runs[0][1] == prompt
    run = (await client.get(f"/v1/runs/{response.json()['id']}")).json()
    assert run["prompt"] == prompt


async def test_openapi_schema_lists_every_route_and_the_bearer_scheme(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert set(schema["paths"]) == {
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/cancel",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/tools",
        "/metrics",
        "/healthz",
    }
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "security" in schema["paths"]["/v1/runs"]["post"]
    assert "security" not in schema["paths"]["/healthz"]["get"]
    assert "RunRequest" in schema["components"]["schemas"]


# --- Runs, state and events (stub executor: the state is written by the test) --------------------


async def test_a_run_is_accepted_queued_and_readable(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    response = await client.post("/v1/runs", json={"prompt": "hello", "options": {"max_turns": 3}})
    assert response.status_code == 202
    run_id = response.json()["id"]
    assert response.json()["status"] == "queued"
    assert response.headers["location"] == f"/v1/runs/{run_id}"
    assert stub.runs[0][0] == run_id
    assert stub.runs[0][2].run_id == run_id  # the workspace is named after the run
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "queued"
    assert run["options"]["max_turns"] == 3
    assert run["options"]["run_id"] == run_id
    assert run["transcript"] is None


async def test_options_left_out_take_the_servers_settings(
    redis_server: fakeredis.FakeServer, stub: StubExecutor
) -> None:
    app = create_app(
        api_settings(max_turns=7), redis=fake_redis(redis_server), executor=lambda *_: stub
    )
    async with serving(app) as api:
        await api.post("/v1/runs", json={"prompt": "p"})
        await api.post("/v1/runs", json={"prompt": "p", "options": {"max_turns": 2}})
    assert [options.max_turns for _, _, options in stub.runs] == [7, 2]


async def test_an_unreachable_store_is_a_clear_503(stub: StubExecutor) -> None:
    down = fakeredis.FakeServer()
    app = create_app(api_settings(), redis=fake_redis(down), executor=lambda *_: stub)
    async with serving(app) as api:
        down.connected = False
        created = await api.post("/v1/runs", json={"prompt": "p"})
        health = await api.get("/healthz")
        down.connected = True
    assert created.status_code == 503
    assert "Redis" in created.json()["detail"]
    assert health.status_code == 503
    assert health.json()["redis"] is False


async def test_a_workspace_named_by_the_client_is_kept(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    response = await client.post("/v1/runs", json={"prompt": "p", "options": {"run_id": "ws-1"}})
    assert response.status_code == 202
    assert response.json()["id"] != "ws-1"
    assert stub.runs[0][2].run_id == "ws-1"


async def test_unknown_runs_and_batches_are_404(client: httpx.AsyncClient) -> None:
    for path in ("/v1/runs/run-nope", "/v1/runs/run-nope/events", "/v1/batches/batch-nope"):
        response = await client.get(path)
        assert response.status_code == 404
        assert "nope" in response.json()["detail"]
    assert (await client.post("/v1/runs/run-nope/cancel")).status_code == 404


async def test_no_workers_means_503_not_a_run_that_can_only_fail(
    redis_server: fakeredis.FakeServer,
) -> None:
    idle = StubExecutor(Fleet(tools={}))
    app = create_app(api_settings(), redis=fake_redis(redis_server), executor=lambda *_: idle)
    async with serving(app) as api:
        response = await api.post("/v1/runs", json={"prompt": "hi"})
        batch = await api.post("/v1/batches", json={"items": [{"id": "a", "prompt": "hi"}]})
    assert response.status_code == 503
    assert "worker" in response.json()["detail"]
    assert batch.status_code == 503
    assert idle.runs == [] and idle.batches == []


async def test_events_replay_then_follow_live_until_done(
    app: FastAPI,
    client: httpx.AsyncClient,
    redis_server: fakeredis.FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "p"})).json()["id"]
    store = ApiStore(fake_redis(redis_server), retention_s=60)
    assert await store.mark_running(run_id)
    await store.add_event(run_id, {"type": "text_delta", "text": "Hel"})

    # Know when the stream has replayed what there was and waits for more.
    served: ApiStore = app.state.services.store
    replayed = asyncio.Event()
    read_events = served.read_events

    async def watched_read(
        run: str, after: str, *, block_ms: int, count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        if after != "0":
            replayed.set()
        return await read_events(run, after, block_ms=block_ms, count=count)

    monkeypatch.setattr(served, "read_events", watched_read)
    reader = asyncio.create_task(client.get(f"/v1/runs/{run_id}/events"))
    await asyncio.wait_for(replayed.wait(), 10)
    await store.add_event(run_id, {"type": "text_delta", "text": "lo"})
    await store.add_event(
        run_id, {"type": "final_answer", "text": "Hello", "stop_reason": "answered"}
    )
    assert await store.finish_run(run_id, "succeeded", answer="Hello", stop_reason="answered")
    response = await asyncio.wait_for(reader, 10)

    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [e["type"] for e in events] == ["text_delta", "text_delta", "final_answer", "done"]
    assert events[-1]["status"] == "succeeded"
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "succeeded" and run["answer"] == "Hello"

    # A reconnecting client resumes after the last event it saw.
    resumed = await client.get(
        f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": events[1]["_id"]}
    )
    assert [e["type"] for e in sse_events(resumed.text)] == ["final_answer", "done"]
    bad = await client.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "x; DROP"})
    assert bad.status_code == 400


async def test_cancelling_a_run_not_started_ends_it_and_a_second_cancel_is_409(
    client: httpx.AsyncClient,
) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "p"})).json()["id"]
    first = await client.post(f"/v1/runs/{run_id}/cancel")
    assert first.status_code == 200
    assert first.json() == {"id": run_id, "status": "cancelled"}
    second = await client.post(f"/v1/runs/{run_id}/cancel")
    assert second.status_code == 409
    assert "cancelled" in second.json()["detail"]
    events = sse_events((await client.get(f"/v1/runs/{run_id}/events")).text)
    assert events[-1]["type"] == "done" and events[-1]["status"] == "cancelled"


async def test_a_run_whose_replica_died_is_failed_with_the_reason(
    client: httpx.AsyncClient, redis_server: fakeredis.FakeServer
) -> None:
    store = ApiStore(fake_redis(redis_server), retention_s=60)
    await store.create_run("run-orphan", "p", {}, replica="gone-replica")
    await store.mark_running("run-orphan")
    run = (await client.get("/v1/runs/run-orphan")).json()
    assert run["status"] == "failed"
    assert "gone-replica" in run["error"] and "lease expired" in run["error"]
    events = sse_events((await client.get("/v1/runs/run-orphan/events")).text)
    assert events == [{**events[0], "type": "done", "status": "failed"}]
    assert (await client.post("/v1/runs/run-orphan/cancel")).status_code == 409


async def test_the_lease_keeper_fails_the_work_of_dead_replicas_only(
    client: httpx.AsyncClient, redis_server: fakeredis.FakeServer
) -> None:
    store = ApiStore(fake_redis(redis_server), retention_s=60)
    await store.renew_lease("alive")
    await store.create_run("run-alive", "p", {}, replica="alive")
    await store.create_run("run-dead", "p", {}, replica="dead")
    await store.create_batch("batch-dead", total=2, concurrency=1, replica="dead")
    assert await store.reap_orphans() == 2
    assert await store.reap_orphans() == 0  # once is enough
    assert (await client.get("/v1/runs/run-alive")).json()["status"] == "queued"
    assert (await client.get("/v1/runs/run-dead")).json()["status"] == "failed"
    batch = (await client.get("/v1/batches/batch-dead")).json()
    assert batch["status"] == "failed"
    assert "dead" in batch["error"]


# --- Batches (stub executor) ---------------------------------------------------------------------


async def test_a_batch_is_accepted_and_its_progress_and_results_are_paged(
    client: httpx.AsyncClient, stub: StubExecutor, redis_server: fakeredis.FakeServer
) -> None:
    items = [{"id": f"q{n}", "prompt": f"question {n}"} for n in range(3)]
    response = await client.post("/v1/batches", json={"items": items, "concurrency": 2})
    assert response.status_code == 202
    batch_id = response.json()["id"]
    assert [item.id for item in stub.batches[0][1]] == ["q0", "q1", "q2"]
    assert stub.batches[0][2] == 2

    store = ApiStore(fake_redis(redis_server), retention_s=60)
    assert await store.mark_batch_running(batch_id)
    for n, status in enumerate(["ok", "error"]):
        await store.batch_item_started(batch_id)
        await store.add_batch_result(batch_id, {"id": f"q{n}", "status": status})
    await store.batch_item_started(batch_id)

    batch = (await client.get(f"/v1/batches/{batch_id}")).json()
    assert batch["status"] == "running"
    assert batch["progress"] == {"total": 3, "done": 2, "ok": 1, "error": 1, "running": 1}
    assert [r["id"] for r in batch["results"]] == ["q0", "q1"]
    page = (await client.get(f"/v1/batches/{batch_id}", params={"offset": 1, "limit": 5})).json()
    assert [r["id"] for r in page["results"]] == ["q1"]
    bad_page = await client.get(f"/v1/batches/{batch_id}", params={"limit": 0})
    assert bad_page.status_code == 422
    assert bad_page.json()["errors"][0]["field"] == "limit"


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"items": []}, "items", "at least 1 item"),
        ({"items": [{"id": "a"}]}, "items.0.prompt", "Field required"),
        ({"items": [{"id": "a", "prompt": "p"}] * 2}, "body", "duplicate item id 'a'"),
        ({"items": [{"id": "a", "prompt": "p"}], "concurrency": 0}, "concurrency", "greater"),
        ({"items": [{"id": "a", "prompt": "p", "enable": ["x"]}]}, "items.0.enable.0", "'x'"),
    ],
)
async def test_an_invalid_batch_is_refused_naming_the_field(
    client: httpx.AsyncClient, stub: StubExecutor, body: dict[str, Any], field: str, reason: str
) -> None:
    response = await client.post("/v1/batches", json=body)
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert errors[0]["field"] == field
    assert reason in errors[0]["message"]
    assert stub.batches == []


async def test_tools_lists_the_fleet_with_live_workers(client: httpx.AsyncClient) -> None:
    tools = {t["name"]: t for t in (await client.get("/v1/tools")).json()}
    assert tools["read_file"]["live_workers"] == 1
    assert tools["read_file"]["enabled_by_default"] is True
    assert tools["run_bash"] == {
        "name": "run_bash",
        "pool": "sandbox",
        "description": "run_bash for tests",
        "parameters": {"type": "object", "properties": {}},
        "enabled_by_default": False,
        "idempotent": True,
        "live_workers": 0,
    }


# --- Runs executed for real, on a scripted model -------------------------------------------------

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "answer": [{"content": "The answer, streamed in small pieces, is 42."}],
    "stall": [{"content": "too late", "fault": {"kind": "stall", "seconds": 60}}],
    "refused": [{"content": "never", "fault": {"kind": "status", "status": 400}}],
}


@pytest.fixture(scope="module")
def model_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedServer]:
    scripts: Path = tmp_path_factory.mktemp("scripts")
    for name, steps in SCRIPTS.items():
        (scripts / f"{name}.json").write_text(json.dumps({"steps": steps}))
    with ScriptedServer(Script.from_steps([{"content": "default"}]), scripts_dir=scripts) as server:
        yield server


def real_executor(server: ScriptedServer, settings: OrchestratorSettings) -> ExecutorFactory:
    def make(store: ApiStore, metrics: ApiMetrics, replica: str) -> Executor:
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
def live_app(model_server: ScriptedServer, redis_server: fakeredis.FakeServer) -> FastAPI:
    settings = api_settings()
    return create_app(
        settings,
        redis=fake_redis(redis_server),
        executor=real_executor(model_server, settings),
        queue_depths=lambda _: {"tools": 0, "sandbox": 0},
    )


def ask(script: str) -> dict[str, Any]:
    """A run on a script; a prompt of its own, as the model's faults count per conversation."""
    return {"prompt": f"question {uuid.uuid4().hex}", "options": {"model": f"scripted:{script}"}}


async def status_of(api: httpx.AsyncClient, run_id: str) -> str:
    status: str = (await api.get(f"/v1/runs/{run_id}")).json()["status"]
    return status


async def test_a_run_streams_its_answer_and_keeps_its_transcript(live_app: FastAPI) -> None:
    async with serving(live_app) as api:
        created = await api.post("/v1/runs", json=ask("answer"))
        run_id = created.json()["id"]
        events = sse_events((await api.get(f"/v1/runs/{run_id}/events")).text)
        run = (await api.get(f"/v1/runs/{run_id}")).json()
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


async def test_a_model_that_refuses_fails_the_run_with_its_reason(live_app: FastAPI) -> None:
    async with serving(live_app) as api:
        created = await api.post("/v1/runs", json=ask("refused"))
        run_id = created.json()["id"]
        events = sse_events((await api.get(f"/v1/runs/{run_id}/events")).text)
        run = (await api.get(f"/v1/runs/{run_id}")).json()
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
    model_server: ScriptedServer, redis_server: fakeredis.FakeServer
) -> None:
    settings = api_settings()
    first = create_app(
        settings, redis=fake_redis(redis_server), executor=real_executor(model_server, settings)
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

    second = create_app(
        settings, redis=fake_redis(redis_server), executor=lambda *_: StubExecutor()
    )
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
