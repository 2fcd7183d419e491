"""The MCP server as clients meet it: ``toolq mcp`` over stdio, ``/mcp`` on a real ``toolq serve``,
both in front of the session's worker fleet, reached with the official MCP client."""

from __future__ import annotations

import contextlib
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import httpx2
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from api.local.stack import free_port, worker_environment
from tests.conftest import WorkerFleet, wait_for
from tests.e2e.commands import clean_env

TOOLQ = str(Path(sys.executable).parent / "toolq")
TOKEN = "mcp-test-token"
AUTH = {"Authorization": f"Bearer {TOKEN}"}

#: Opens an MCP session with these tool options (enable, disable, tool_timeout_ms).
Connect = Callable[..., AbstractAsyncContextManager[Client]]


def fleet_env(fleet: WorkerFleet) -> dict[str, str]:
    """This environment without toolq or OpenAI settings, then the fleet's."""
    return clean_env() | worker_environment(fleet.settings)


def mcp_refused(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``toolq mcp`` with ``args``, as a client starts it (nothing on stdin), when it is expected
    to refuse before serving: what it said and its exit status."""
    return subprocess.run(
        [TOOLQ, "mcp", *args],
        env=env,
        input="",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


class ServedApi:
    """``toolq serve`` on a free port, with a token (or ``env``'s tokens); its log (stdout and
    stderr) for failures."""

    def __init__(self, fleet: WorkerFleet, log: Path, env: dict[str, str] | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # No model API: /mcp needs none, and toolq serve starts without one.
        env = fleet_env(fleet) | (env if env is not None else {"TOOLQ_API_TOKEN": TOKEN})
        self._log = log.open("wb")
        self.proc = subprocess.Popen(
            [TOOLQ, "serve", "--port", str(self.port)],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        self._log_path = log

    def healthy(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"toolq serve exited:\n{self.log()}")
        try:
            with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def log(self) -> str:
        return self._log_path.read_text(errors="replace")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self._log.close()


@pytest.fixture(scope="module")
def served_api(fleet: WorkerFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServedApi]:
    api = ServedApi(fleet, tmp_path_factory.mktemp("serve") / "serve.log")
    try:
        wait_for(api.healthy, timeout=60, what="toolq serve to answer /healthz")
        yield api
    finally:
        api.stop()


def mcp_url(api: ServedApi, **options: Any) -> str:
    query = [
        (name, str(value))
        for name, values in options.items()
        for value in (values if isinstance(values, list | tuple) else [values])
    ]
    encoded = "&".join(f"{name}={value}" for name, value in query)
    return f"{api.url}/mcp" + (f"?{encoded}" if encoded else "")


@contextlib.asynccontextmanager
async def http_session(
    api: ServedApi, headers: dict[str, str] | None = None, **options: Any
) -> AsyncIterator[Client]:
    async with (
        httpx2.AsyncClient(headers=AUTH if headers is None else headers, timeout=60) as http,
        Client(streamable_http_client(mcp_url(api, **options), http_client=http)) as client,
    ):
        yield client


@contextlib.asynccontextmanager
async def stdio_session(fleet: WorkerFleet, **options: Any) -> AsyncIterator[Client]:
    args = ["mcp"]
    for name, values in options.items():
        for value in values if isinstance(values, list | tuple) else [values]:
            args += [f"--{name.replace('_', '-')}", str(value)]
    params = StdioServerParameters(command=TOOLQ, args=args, env=fleet_env(fleet))
    async with Client(params) as client:
        yield client


@pytest.fixture(params=["stdio", "http"])
def connect(request: pytest.FixtureRequest, fleet: WorkerFleet) -> Connect:
    """An MCP session on one transport or the other."""
    if request.param == "stdio":
        return lambda **options: stdio_session(fleet, **options)
    api: ServedApi = request.getfixturevalue("served_api")
    return lambda **options: http_session(api, **options)
