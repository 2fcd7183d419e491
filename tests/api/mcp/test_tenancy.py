"""MCP sessions over HTTP are their tenant's, tried as another tenant would: another token's
session id answers as an unknown one for POST, GET and DELETE, session ids never reach a log, and
a tenant holds at most TOOLQ_TENANT_MAX_MCP_SESSIONS sessions at once."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import httpx
import httpx2
import mcp_types as types
import pytest
import redis
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS

import api.mcp.http
from api.http.app import create_app
from api.settings import OrchestratorSettings
from tests.api.http.conftest import StubExecutor
from tests.api.http.serving import served_in_thread
from tests.api.mcp.conftest import ServedApi, mcp_url
from tests.conftest import RedisServer, WorkerFleet, wait_for
from worker.contract.keys import tenant_holdings_key

pytestmark = pytest.mark.integration

CAP = 2
#: Each test module's own tenants: the fleet's Redis counts every module's sessions.
TOKENS = {
    f"alpha-{uuid.uuid4().hex[:6]}": "alpha-token-0123456789abcdef",
    f"beta-{uuid.uuid4().hex[:6]}": "beta-token-0123456789abcdef",
    f"gamma-{uuid.uuid4().hex[:6]}": "gamma-token-0123456789abcdef",
}
ALPHA, BETA, GAMMA = TOKENS
PROTOCOL = HANDSHAKE_PROTOCOL_VERSIONS[-1]
#: The loggers of the tests' MCP and HTTP clients, which run in the server's process here.
CLIENT_LOGGERS = ("httpcore", "httpx", "mcp.client")


def bearer(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {TOKENS[tenant]}"}


def tokens_file(folder: Path) -> Path:
    path = folder / "tokens"
    path.write_text("".join(f"{name} {token}\n" for name, token in TOKENS.items()))
    return path


def text(result: types.CallToolResult) -> str:
    block = result.content[0]
    assert isinstance(block, types.TextContent)
    return block.text


@pytest.fixture(scope="module")
def tenants_api(
    fleet: WorkerFleet, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServedApi]:
    """``toolq serve`` with two tenants, logging everything down to DEBUG."""
    folder = tmp_path_factory.mktemp("tenants")
    env = {
        "TOOLQ_API_TOKENS_FILE": str(tokens_file(folder)),
        "TOOLQ_TENANT_MAX_MCP_SESSIONS": str(CAP),
        "TOOLQ_LOG_LEVEL": "DEBUG",
    }
    api = ServedApi(fleet, folder / "serve.log", env)
    try:
        wait_for(api.healthy, timeout=60, what="toolq serve to answer /healthz")
        yield api
    finally:
        api.stop()


@contextlib.asynccontextmanager
async def tenant_session(url: str, tenant: str) -> AsyncIterator[tuple[Client, str]]:
    """An MCP session of ``tenant``'s, with the official client, and the session id it got."""
    given: list[str] = []

    async def note(response: httpx2.Response) -> None:
        if session := response.headers.get("mcp-session-id"):
            given.append(session)

    async with (
        httpx2.AsyncClient(
            headers=bearer(tenant), timeout=60, event_hooks={"response": [note]}
        ) as http,
        Client(streamable_http_client(url, http_client=http)) as client,
    ):
        yield client, given[0]


def mcp_request(method: str, call: int) -> dict[str, object]:
    if method == "tools/call":
        command = "echo planted > planted.txt; cat secret.txt"
        params: dict[str, object] = {"name": "run_bash", "arguments": {"command": command}}
    else:
        params = {}
    return {"jsonrpc": "2.0", "id": call, "method": method, "params": params}


def answers(url: str, tenant: str, session: str) -> dict[str, tuple[int, str]]:
    """What ``tenant`` is answered for session id ``session``: a tool call and a listing
    (POST), the event stream (GET) and the end of the session (DELETE)."""
    headers = bearer(tenant) | {
        "Mcp-Session-Id": session,
        "MCP-Protocol-Version": PROTOCOL,
        "Accept": "application/json, text/event-stream",
    }
    seen: dict[str, tuple[int, str]] = {}
    with httpx.Client(headers=headers, timeout=20) as http:
        for call, method in enumerate(("tools/call", "tools/list"), 1):
            answer = http.post(url, json=mcp_request(method, call))
            seen[f"POST {method}"] = (answer.status_code, answer.text)
        answer = http.get(url)
        seen["GET"] = (answer.status_code, answer.text)
        answer = http.delete(url)
        seen["DELETE"] = (answer.status_code, answer.text)
    return seen


async def test_another_tenants_session_id_is_an_unknown_one_and_the_session_goes_on(
    tenants_api: ServedApi,
) -> None:
    url = mcp_url(tenants_api, enable="run_bash")
    async with tenant_session(url, BETA) as (session, session_id):
        written = await session.call_tool("write_file", {"path": "secret.txt", "content": "beta"})
        assert not written.is_error, text(written)

        stolen = await asyncio.to_thread(answers, url, ALPHA, session_id)
        unknown = await asyncio.to_thread(answers, url, ALPHA, uuid.uuid4().hex)
        assert stolen == unknown
        assert {status for status, _ in stolen.values()} == {404}
        assert all("beta" not in body for _, body in stolen.values())

        # The session is beta's still: the DELETE ended nothing, the call planted nothing.
        read = await session.call_tool("read_file", {"path": "secret.txt"})
        assert not read.is_error, text(read)
        assert "beta" in text(read)
        planted = await session.call_tool("read_file", {"path": "planted.txt"})
        assert planted.is_error
        mine = await asyncio.to_thread(answers, url, BETA, session_id)
        assert mine["POST tools/list"][0] == 200

    log = tenants_api.log()
    assert session_id not in log
    assert "<session>" in log  # the SDK did log about the session, with its id hidden


def mcp_error(exc: BaseException) -> MCPError | None:
    """The MCP error ``exc`` is or holds (the client raises it inside exception groups)."""
    if isinstance(exc, MCPError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            if (found := mcp_error(inner)) is not None:
                return found
    return None


async def refusal(url: str, tenant: str) -> MCPError | None:
    """The MCP error a new session of ``tenant`` is refused with, or None: it opened."""
    try:
        async with tenant_session(url, tenant) as (session, _):
            await session.list_tools()
    except BaseException as exc:
        if (found := mcp_error(exc)) is None:
            raise
        return found
    return None


async def eventually_opens(url: str, tenant: str, bound_s: float = 30.0) -> None:
    """Opens a session of ``tenant`` once one of its places is free again (a session's place
    is given back just after its end is answered)."""
    for _ in range(int(bound_s / 0.1)):
        if await refusal(url, tenant) is None:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{tenant} could not open a session within {bound_s} s")


async def test_a_tenant_at_its_session_cap_is_refused_in_one_line_and_no_other_is(
    tenants_api: ServedApi,
) -> None:
    url = mcp_url(tenants_api)
    async with contextlib.AsyncExitStack() as held:
        for _ in range(CAP - 1):
            await held.enter_async_context(tenant_session(url, ALPHA))
        # Entered last, so that it can end first (the client's task groups nest).
        last = await held.enter_async_context(contextlib.AsyncExitStack())
        await last.enter_async_context(tenant_session(url, ALPHA))

        refused = await refusal(url, ALPHA)
        assert refused is not None
        message = str(refused)
        assert f"TOOLQ_TENANT_MAX_MCP_SESSIONS={CAP}" in message
        assert f"holds {CAP} MCP sessions" in message
        assert "\n" not in message

        assert await refusal(url, BETA) is None  # another tenant opens sessions as before

        await last.aclose()  # the client ends its session: a DELETE
        await eventually_opens(url, ALPHA)


# --- in this process: every logger the server has, and a session that idles out ------------


@contextlib.asynccontextmanager
async def served_here(
    redis_server: RedisServer, folder: Path, **settings: object
) -> AsyncIterator[str]:
    """An API with two tenants under uvicorn, in a thread of this process; its /mcp URL."""
    app = create_app(
        OrchestratorSettings(
            broker_url=redis_server.url,
            api_tokens_file=tokens_file(folder),
            **settings,  # type: ignore[arg-type]
        ),
        executor=lambda *_: StubExecutor(),
    )
    # No log config of uvicorn's own: its loggers then reach the root logger, and caplog.
    async with served_in_thread(app, log_level="debug", log_config=None) as url:
        yield f"{url}/mcp"


async def test_no_logger_of_the_server_sees_a_session_id_at_any_level(
    redis_server: RedisServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    async with served_here(redis_server, tmp_path) as url:
        async with tenant_session(url, BETA) as (session, session_id):
            assert (await session.list_tools()).tools
            stolen = await asyncio.to_thread(answers, url, ALPHA, session_id)
            assert stolen["DELETE"][0] == 404
            assert (await session.list_tools()).tools  # beta's still
        async with tenant_session(url, ALPHA) as (_, own_id):
            pass
    # This process is the clients' too: their HTTP libraries log the headers they receive.
    server = [r for r in caplog.records if not r.name.startswith(CLIENT_LOGGERS)]
    said = "".join(
        f"{logging.Formatter().format(record)} {json.dumps(record.__dict__, default=str)}\n"
        for record in server
    )
    assert session_id not in said
    assert own_id not in said
    assert any(r.name.startswith("uvicorn") for r in server)
    sdk = [r.getMessage() for r in server if r.name.startswith("mcp.server")]
    assert any("<session>" in message for message in sdk), sdk


def initialize(url: str, tenant: str) -> httpx.Response:
    """A client's opening request, and nothing after it: the session then idles."""
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {
            "protocolVersion": PROTOCOL,
            "capabilities": {},
            "clientInfo": {"name": "idler", "version": "0"},
        },
    }
    headers = bearer(tenant) | {"Accept": "application/json, text/event-stream"}
    with httpx.Client(headers=headers, timeout=20) as http:
        return http.post(url, json=body)


async def test_a_session_that_idles_out_gives_its_place_back(
    redis_server: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(api.mcp.http, "SESSION_IDLE_TIMEOUT_S", 1.0)
    holdings = redis.Redis.from_url(redis_server.url)
    key = tenant_holdings_key("mcp-sessions", GAMMA)
    async with served_here(redis_server, tmp_path, tenant_max_mcp_sessions=1) as url:
        opened = await asyncio.to_thread(initialize, url, GAMMA)
        assert opened.status_code == 200, opened.text
        assert holdings.zcard(key) == 1
        refused = await asyncio.to_thread(initialize, url, GAMMA)
        assert refused.status_code == 429
        assert "TOOLQ_TENANT_MAX_MCP_SESSIONS=1" in refused.json()["error"]["message"]
        await asyncio.to_thread(
            wait_for, lambda: holdings.zcard(key) == 0, 30, "the idle session's place to free"
        )
        again = await asyncio.to_thread(initialize, url, GAMMA)
        assert again.status_code == 200, again.text
    holdings.close()
