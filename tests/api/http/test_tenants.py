"""Several tokens, each one's runs and batches its own: tried as another tenant would try them.

Redis is a real redis-server (a database of these tests' own). Nothing executes (a stub
executor), but in the last test: a real `toolq serve` running conversations on real workers.
"""

from __future__ import annotations

import re
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis
from fastapi import FastAPI
from pydantic import SecretStr

from api.http.app import create_app
from api.http.server import serve
from api.http.tenants import RUN_ID_CHARS, Tenants
from api.http.viewer.tickets import StreamTickets
from api.local.stack import free_port
from api.scripted.server import ScriptedServer
from api.state.store import ApiStore
from tests.api.http.conftest import (
    TOKEN,
    StubExecutor,
    api_settings,
    emptied_database,
    serving,
)
from tests.api.http.serving import Replica, serve_environment
from tests.conftest import RedisServer, WorkerFleet
from worker.contract.keys import run_state_key
from worker.contract.wire import RUN_ID_PATTERN

ALICE = "alice-0123456789abcdef"
BOB = "bob-fedcba9876543210xyz"
TOKENS = f"# tenants of the tests\nalice {ALICE}\n\nbob   {BOB}\n"
#: A database of the session's redis-server that only these tests use.
DATABASE = 11
UNKNOWN_RUN = "run-" + "0" * 32
UNKNOWN_BATCH = "batch-" + "0" * 32


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tokens_file(directory: Path, text: str = TOKENS) -> Path:
    path = directory / "tokens"
    path.write_text(text)
    return path


@dataclass
class Callers:
    app: FastAPI
    alice: httpx.AsyncClient
    bob: httpx.AsyncClient
    #: A browser without the token: what opens a viewer's live stream.
    anonymous: httpx.AsyncClient


@pytest.fixture
async def state(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    async with emptied_database(redis_server, DATABASE) as client:
        yield client


@pytest.fixture
def store(state: aioredis.Redis) -> ApiStore:
    return ApiStore(state, retention_s=60)


@asynccontextmanager
async def callers_of(app: FastAPI, *tokens: str) -> AsyncIterator[list[httpx.AsyncClient]]:
    """A client per token (and one with none) on ``app``, whose lifespan runs once for all."""
    transport = httpx.ASGITransport(app=app)
    clients = [
        httpx.AsyncClient(transport=transport, base_url="http://toolq", headers=headers)
        for headers in [*(bearer(token) for token in tokens), {}]
    ]
    async with app.router.lifespan_context(app):
        try:
            yield clients
        finally:
            for client in clients:
                await client.aclose()


@pytest.fixture
async def callers(
    state: aioredis.Redis, stub: StubExecutor, tmp_path: Path
) -> AsyncIterator[Callers]:
    settings = api_settings(api_token=None, api_tokens_file=tokens_file(tmp_path))
    app = create_app(settings, redis=state, executor=lambda *_: stub)
    async with callers_of(app, ALICE, BOB) as (alice, bob, anonymous):
        yield Callers(app, alice, bob, anonymous)


async def start_run(client: httpx.AsyncClient, prompt: str, **options: Any) -> str:
    response = await client.post("/v1/runs", json={"prompt": prompt, "options": options})
    assert response.status_code == 202, response.text
    run_id: str = response.json()["id"]
    return run_id


async def start_batch(client: httpx.AsyncClient, prompt: str) -> str:
    response = await client.post("/v1/batches", json={"items": [{"id": "one", "prompt": prompt}]})
    assert response.status_code == 202, response.text
    batch_id: str = response.json()["id"]
    return batch_id


async def assert_answered_as_unknown(
    client: httpx.AsyncClient, method: str, path: str, taken: str, unknown: str
) -> httpx.Response:
    """``path`` with ``taken`` (another tenant's id) is answered exactly as with ``unknown``, an
    id nobody has: the same status, headers and body but for the id."""
    stolen = await client.request(method, path.format(taken))
    missing = await client.request(method, path.format(unknown))
    assert stolen.status_code == missing.status_code == 404, (path, stolen.text)
    assert stolen.text.replace(taken, unknown) == missing.text
    assert dict(stolen.headers) == dict(missing.headers)
    return stolen


# --- Another tenant's runs and batches -----------------------------------------------------------


async def test_another_tokens_run_is_404_as_an_unknown_one_is(
    callers: Callers, store: ApiStore
) -> None:
    run_id = await start_run(callers.alice, "the secret plan of alice")
    assert await store.mark_running(run_id)
    await store.add_event(run_id, {"type": "text_delta", "text": "the secret draft of alice"})
    for method, path in [
        ("GET", "/v1/runs/{}"),
        ("GET", "/v1/runs/{}/events"),
        ("POST", "/v1/runs/{}/cancel"),
        ("GET", "/ui/page/runs/{}"),
    ]:
        answer = await assert_answered_as_unknown(callers.bob, method, path, run_id, UNKNOWN_RUN)
        assert "secret" not in answer.text
    # Bob signs a stream ticket with his own token: it opens no stream of Alice's.
    bobs_tickets = StreamTickets(SecretStr(BOB))
    path = "/ui/live/runs/{}"
    stolen = await callers.anonymous.get(
        path.format(run_id), params={"ticket": bobs_tickets.mint(path.format(run_id))}
    )
    assert stolen.status_code == 404 and "secret" not in stolen.text
    # Bob's cancel stopped nothing: Alice's run goes on, and she reads it all.
    run = (await callers.alice.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "running" and run["prompt"] == "the secret plan of alice"
    assert "the secret draft of alice" in (await callers.alice.get(f"/ui/page/runs/{run_id}")).text


async def test_another_tokens_batch_is_404_as_an_unknown_one_is(
    callers: Callers, store: ApiStore
) -> None:
    batch_id = await start_batch(callers.alice, "the secret task of alice")
    assert await store.mark_batch_running(batch_id)
    await store.batch_item_started(batch_id)
    record = {"id": "one", "status": "ok", "answer": "the secret answer of alice", "messages": []}
    await store.add_batch_result(batch_id, record)
    for path in ["/v1/batches/{}", "/ui/page/batches/{}", "/ui/page/batches/{}/items/1"]:
        answer = await assert_answered_as_unknown(callers.bob, "GET", path, batch_id, UNKNOWN_BATCH)
        assert "secret" not in answer.text
    path = f"/ui/live/batches/{batch_id}"
    ticket = StreamTickets(SecretStr(BOB)).mint(path)
    assert (await callers.anonymous.get(path, params={"ticket": ticket})).status_code == 404
    mine = (await callers.alice.get(f"/v1/batches/{batch_id}")).json()
    assert mine["results"] == [record]


async def test_each_token_lists_its_own_runs_and_batches_and_no_others(
    callers: Callers,
) -> None:
    alices_runs = [await start_run(callers.alice, f"alice {n}") for n in range(2)]
    alices_batch = await start_batch(callers.alice, "alice's batch")
    bobs_run = await start_run(callers.bob, "bob's question")
    bob_sees = (await callers.bob.get("/ui/page/runs")).text
    assert bobs_run in bob_sees
    assert not any(run_id in bob_sees for run_id in alices_runs) and "alice" not in bob_sees
    for page in ("/ui/page/batches", "/ui/page/"):
        assert alices_batch not in (await callers.bob.get(page)).text
        assert alices_batch in (await callers.alice.get(page)).text
    alice_sees = (await callers.alice.get("/ui/page/runs")).text
    assert all(run_id in alice_sees for run_id in alices_runs) and bobs_run not in alice_sees


async def test_a_wrong_token_is_refused_naming_where_tokens_come_from(callers: Callers) -> None:
    for headers in ({"Authorization": "Bearer alice-0123456789abcdeX"}, {}):
        response = await callers.anonymous.get("/v1/tools", headers=headers)
        assert response.status_code == 401
        assert "TOOLQ_API_TOKENS_FILE" in response.json()["detail"]


# --- Workspaces ----------------------------------------------------------------------------------


async def test_two_tokens_choosing_one_run_id_get_two_workspaces(
    callers: Callers, stub: StubExecutor
) -> None:
    alices = await start_run(callers.alice, "hello", run_id="shared")
    bobs = await start_run(callers.bob, "hello", run_id="shared")
    assert [options.run_id for _, _, options in stub.runs] == ["alice.shared", "bob.shared"]
    # Each sees the run_id it chose.
    assert (await callers.alice.get(f"/v1/runs/{alices}")).json()["options"]["run_id"] == "shared"
    assert (await callers.bob.get(f"/v1/runs/{bobs}")).json()["options"]["run_id"] == "shared"
    batch_id = await start_batch(callers.bob, "hello")
    workspace_of = stub.batch_workspaces[batch_id]
    assert workspace_of is not None and workspace_of("b-1-one") == "bob.b-1-one"


def test_a_long_run_id_keeps_a_workspace_name_of_its_tenants_the_workers_take() -> None:
    tenants = Tenants({"a-tenant-named-at-length": SecretStr(ALICE)}, scoped=True)
    long_ids = ["x" * (RUN_ID_CHARS - 1), "x" * (RUN_ID_CHARS - 2) + "y"]
    names = [tenants.workspace("a-tenant-named-at-length", run_id) for run_id in long_ids]
    assert len(set(names)) == 2
    for name in names:
        assert len(name) <= RUN_ID_CHARS and name.startswith("a-tenant-named-at-length.")
        assert re.match(RUN_ID_PATTERN, name)


# --- One token, as before ------------------------------------------------------------------------


async def old_run(store: ApiStore) -> str:
    """A run as the API wrote them before tenants: with no tenant."""
    await store.create_run("run-from-before", "an old question", {}, "gone-replica")
    await store.redis.hdel(run_state_key("run-from-before"), "tenant")
    return "run-from-before"


async def test_a_single_token_works_as_before_and_keeps_the_runs_from_before(
    state: aioredis.Redis, store: ApiStore, stub: StubExecutor
) -> None:
    app = create_app(api_settings(), redis=state, executor=lambda *_: stub)
    before = await old_run(store)
    async with serving(app) as api:
        assert (await api.get(f"/v1/runs/{before}")).json()["prompt"] == "an old question"
        assert before in (await api.get("/ui/page/runs")).text
        await start_run(api, "new", run_id="mine")
        assert stub.runs[0][2].run_id == "mine"  # the workspace keeps the run_id's name
        wrong = await api.get("/v1/tools", headers=bearer(ALICE))
        assert wrong.json()["detail"] == "the bearer token is not this server's TOOLQ_API_TOKEN"


async def test_the_plain_token_beside_a_file_is_one_more_tenant_with_the_runs_from_before(
    state: aioredis.Redis, store: ApiStore, stub: StubExecutor, tmp_path: Path
) -> None:
    settings = api_settings(api_tokens_file=tokens_file(tmp_path))
    app = create_app(settings, redis=state, executor=lambda *_: stub)
    before = await old_run(store)
    async with callers_of(app, TOKEN, ALICE) as (plain, alice, _):
        assert (await plain.get(f"/v1/runs/{before}")).status_code == 200
        assert (await alice.get(f"/v1/runs/{before}")).status_code == 404
        assert before not in (await alice.get("/ui/page/runs")).text
        await start_run(plain, "new", run_id="mine")
        assert stub.runs[0][2].run_id == "default.mine"


# --- The tokens file -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "said"),
    [
        (f"alice {ALICE} extra\n", "line 1: expected two words, '<tenant-name> <token>'; found 3"),
        (f"# who\nalice:{ALICE}\n", "line 2: expected two words"),
        (
            f"alice {ALICE}\nalice {BOB}\n",
            "line 2: tenant 'alice' is named twice (first on line",
        ),
        (f"alice {ALICE}\nbob {ALICE}\n", "line 2: tenant 'bob' has the same token as tenant 'a"),
        ("alice short-token\n", "line 1: tenant 'alice''s token has 11 characters; it needs at"),
        (f"al.ice {ALICE}\n", "line 1: the tenant name 'al.ice' must be 1 to 32 letters"),
        (f"default {ALICE}\n", "line 1: tenant 'default' is named twice (TOOLQ_API_TOKEN's)"),
        (f"carol {TOKEN}\n", "line 1: tenant 'carol' has the same token as tenant 'default'"),
        ("# nobody yet\n\n", "names no tenant"),
    ],
)
def test_a_bad_tokens_file_is_refused_in_one_line(
    text: str, said: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tokens_file(tmp_path, text)
    with pytest.raises(SystemExit) as stopped:
        serve("127.0.0.1", free_port(), settings=api_settings(api_tokens_file=path))
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and error.startswith("error: TOOLQ_API_TOKENS_FILE")
    assert said in error, error
    assert ALICE not in error and BOB not in error and TOKEN not in error


def test_a_tokens_file_that_cannot_be_read_is_refused_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-file"
    with pytest.raises(SystemExit) as stopped:
        serve("127.0.0.1", free_port(), settings=api_settings(api_tokens_file=missing))
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"error: TOOLQ_API_TOKENS_FILE: cannot read {missing}: No such file or directory\n"
    )


def test_a_tokens_file_alone_is_a_token_off_loopback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = api_settings(api_token=None, api_tokens_file=tokens_file(tmp_path))
    # The port is taken: serve gets past the token check to listening, and stops there.
    with socket.create_server(("0.0.0.0", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stopped:
            serve("0.0.0.0", port, settings=settings)
    assert stopped.value.code == 2
    assert capsys.readouterr().err.startswith(f"error: cannot listen on 0.0.0.0:{port}")


# --- On real workers -----------------------------------------------------------------------------

WRITE_NOTE = {"name": "write_file", "arguments": {"path": "note.txt", "content": "{prompt}"}}
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "note": [{"tool_calls": [WRITE_NOTE]}, {"content": "Noted."}],
    "peek": [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "note.txt"}}]},
        {"content": "I found: {last_tool_result}"},
    ],
}


@pytest.fixture(scope="module")
def served(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Replica, httpx.Client]]:
    """`toolq serve` with a tokens file: Alice's client, and Bob's."""
    env = serve_environment(fleet, model, ALICE)
    del env["TOOLQ_API_TOKEN"]
    env["TOOLQ_API_TOKENS_FILE"] = str(tokens_file(tmp_path_factory.mktemp("tenants")))
    replica = Replica(env, tmp_path_factory.mktemp("tenant-logs"), "serve", ALICE)
    bob = httpx.Client(base_url=replica.url, headers=bearer(BOB), timeout=30)
    with replica.running(), bob:
        yield replica, bob


def run_to_end(client: httpx.Client, script: str, prompt: str) -> dict[str, Any]:
    body = {"prompt": prompt, "options": {"model": f"scripted:{script}", "run_id": "shared"}}
    response = client.post("/v1/runs", json=body)
    assert response.status_code == 202, response.text
    run_id = response.json()["id"]
    events = client.get(f"/v1/runs/{run_id}/events")  # streams until the run ends
    assert events.status_code == 200 and "event: done" in events.text
    run: dict[str, Any] = client.get(f"/v1/runs/{run_id}").json()
    return run


@pytest.mark.integration
def test_two_tenants_choosing_one_run_id_never_share_a_workspace(
    served: tuple[Replica, httpx.Client],
) -> None:
    alice, bob = served
    secret = f"alice's secret {uuid.uuid4().hex}"
    written = run_to_end(alice.client, "note", secret)
    assert written["status"] == "succeeded", written
    peeked = run_to_end(bob, "peek", "what is in note.txt?")
    assert secret not in str(peeked)
    assert peeked["transcript"]["tool_calls"][0]["is_error"] is True  # no note in Bob's
    again = run_to_end(alice.client, "peek", "what is in note.txt?")
    assert again["answer"] == f"I found: {secret}"  # the run_id still names Alice's own
    for method, path in [("GET", ""), ("GET", "/events"), ("POST", "/cancel")]:
        assert bob.request(method, f"/v1/runs/{written['id']}{path}").status_code == 404
