"""What the HTTP API's tests share: an app on fakeredis, a stub executor, a client, SSE parsing.

Redis is fakeredis; runs execute either nowhere (a stub executor, to look at the HTTP surface)
or on the real executor against a scripted model and a fleet view whose tools are never called.
Some modules use a real Redis instead, or a real `toolq serve` on real workers and a scripted
model.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager
from typing import Any

import fakeredis
import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI

from api.batch.items import BatchItem
from api.calls.fleet import Fleet
from api.conversation.agent import AgentOptions
from api.http.app import create_app
from api.http.runner import BatchSubmission, OnEnd
from api.scripted.server import ScriptedServer
from api.settings import OrchestratorSettings
from tests.api.http.serving import Replica, serve_environment
from tests.conftest import RedisServer, WorkerFleet, scripted_server
from worker.contract.wire import Pool, ToolSpec, WorkerInfo

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
        #: What the workers would call each batch's workspaces, by batch id.
        self.batch_workspaces: dict[str, Callable[[str], str] | None] = {}
        #: What each run does once it ends (gives back its tenant's place), by run id.
        self.run_ends: dict[str, OnEnd] = {}

    async def start(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def fleet(self) -> Fleet:
        return self._fleet

    def submit_run(self, run_id: str, prompt: str, options: AgentOptions, on_end: OnEnd) -> None:
        self.runs.append((run_id, prompt, options))
        self.run_ends[run_id] = on_end

    def submit_batch(self, batch: BatchSubmission) -> None:
        self.batches.append((batch.batch_id, list(batch.items), batch.concurrency))
        self.batch_workspaces[batch.batch_id] = batch.workspace_of


@asynccontextmanager
async def serving(app: FastAPI, headers: dict[str, str] = AUTH) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=transport, base_url="http://toolq", headers=headers) as client,
    ):
        yield client


def fake_redis(server: fakeredis.FakeServer) -> fakeredis.FakeAsyncRedis:
    return fakeredis.FakeAsyncRedis(server=server)


# Not named redis_server: that is the real Redis the session's worker fleet runs on.
@pytest.fixture
def fake_server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
def stub() -> StubExecutor:
    return StubExecutor()


@pytest.fixture
def app(fake_server: fakeredis.FakeServer, stub: StubExecutor) -> FastAPI:
    return create_app(api_settings(), redis=fake_redis(fake_server), executor=lambda *_: stub)


@pytest.fixture
async def client(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(app) as api:
        yield api


@asynccontextmanager
async def emptied_database(server: RedisServer, database: int) -> AsyncIterator[aioredis.Redis]:
    """A client of ``database`` on ``server``, emptied first: one a module keeps to itself."""
    client = aioredis.Redis.from_url(f"redis://127.0.0.1:{server.port}/{database}")
    await client.flushdb()
    yield client
    await client.aclose()


@pytest.fixture(scope="module")
def model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ScriptedServer]:
    """The module's scripted model: ``scripted:<name>`` answers with the module's
    ``SCRIPTS[name]``, any other model "default"."""
    scripts: Mapping[str, list[dict[str, Any]]] = getattr(request.module, "SCRIPTS", {})
    with scripted_server(tmp_path_factory.mktemp("scripts"), scripts) as server:
        yield server


@pytest.fixture(scope="module")
def server(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Replica]:
    """A `toolq serve` of the module's own on the session's fleet and the module's model,
    behind TOKEN."""
    env = serve_environment(fleet, model, TOKEN)
    with Replica(env, tmp_path_factory.mktemp("serve"), "serve", TOKEN).running() as replica:
        yield replica


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
