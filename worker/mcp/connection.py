"""One MCP server kept running for a worker process: started over stdio with the official client,
started again whenever it stops, and called by the process's tool calls.

Everything here runs on the host's event loop (``worker/mcp/host.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from types import TracebackType
from typing import Any, TextIO

import anyio
import mcp_types as types
from mcp import Client, StdioServerParameters
from mcp.client.stdio import stdio_client
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types import CONNECTION_CLOSED

from worker.contract.mcp_servers import McpServerConfig
from worker.exceptions import ServerStoppedError, ServerUnavailableError

log = logging.getLogger(__name__)

#: How long a server may take to start and list its tools.
START_TIMEOUT_S = 20.0
#: Waits before each new start of a server that keeps failing to start.
RESTART_DELAYS_S = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)
#: How long a server has to answer after a call was given up on; else it is restarted.
LIVENESS_TIMEOUT_S = 2.0


class ServerConnection:
    """The client side of one server; ``keep_running`` owns its life, ``call`` uses it."""

    def __init__(
        self,
        config: McpServerConfig,
        *,
        start_timeout_s: float = START_TIMEOUT_S,
        errlog: TextIO | None = None,
    ) -> None:
        self.config = config
        #: The tools the server listed when it first started.
        self.tools: list[types.Tool] = []
        #: Why the server is not running, when it is not.
        self.problem: str | None = None
        self._start_timeout_s = start_timeout_s
        # The server's stderr goes to the worker's own, which its log keeps; not to sys.stderr,
        # which Celery replaces with a logger that has no file descriptor to give a child.
        self._errlog = errlog or sys.__stderr__ or sys.stderr
        self._client: Client | None = None
        self._scope: anyio.CancelScope | None = None
        self._stopping = False
        self._stopped = asyncio.Event()
        # Resolved when the start under way has ended, started or not: calls wait on it.
        self._attempt: asyncio.Future[None] | None = None
        # Pending while ``check_alive`` finds out whether the server still answers.
        self._checking: asyncio.Future[None] | None = None
        #: Set once the first start has ended, started or not.
        self.first_attempt_ended = asyncio.Event()

    async def keep_running(self) -> None:
        """Start the server, and again whenever it stops or fails to start, until ``stop``."""
        self._renew_attempt()
        failures = 0
        said: str | None = None
        while not self._stopping:
            started = await self._live()
            if self._stopping:
                break
            if started:
                failures = 0
                log.warning("MCP server %r stopped; starting it again", self.config.name)
            else:
                failures += 1
                self._settle()  # calls in the meantime fail at once, saying why
                # Said once as an error; the same failure again, as it is retried, only shows
                # in a debug log.
                level = logging.ERROR if self.problem != said else logging.DEBUG
                log.log(level, "MCP server %r %s", self.config.name, self.problem)
                said = self.problem
                delay = RESTART_DELAYS_S[min(failures, len(RESTART_DELAYS_S) - 1)]
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._stopped.wait(), delay)
            self._renew_attempt()
        self.problem = "the worker process is stopping"
        self._settle()

    async def call(self, tool: str, arguments: dict[str, Any]) -> types.CallToolResult:
        if self._checking is not None:
            await asyncio.shield(self._checking)  # the server may be hung: wait to know
        client = self._client
        if client is None and self._attempt is not None:
            await asyncio.shield(self._attempt)  # a start under way: wait for it
            client = self._client
        if client is None:
            raise ServerUnavailableError(
                f"the MCP server {self.config.name!r} is not running: {self.problem}"
            )
        try:
            return await client.call_tool(tool, arguments)
        except MCPError as exc:
            if exc.code != CONNECTION_CLOSED:
                raise
            raise ServerStoppedError(
                f"the MCP server {self.config.name!r} stopped during the call, so whether it "
                "did anything is unknown; the server is being started again"
            ) from None

    async def check_alive(self) -> None:
        """After a call was given up on: a server that cannot answer a listing of its tools
        (a request every protocol version has) is restarted. Calls wait for the verdict."""
        client = self._client
        if client is None:
            return
        self._checking = asyncio.get_running_loop().create_future()
        try:
            with anyio.fail_after(LIVENESS_TIMEOUT_S):
                await client.list_tools(cache_mode="bypass")
        except Exception as exc:
            log.warning(
                "MCP server %r did not answer after a call was stopped (%s); restarting it",
                self.config.name,
                describe(exc) if not isinstance(exc, TimeoutError) else "no answer",
            )
            self.restart()
        finally:
            self._checking.set_result(None)
            self._checking = None

    def restart(self) -> None:
        """End the server's present life; calls wait for the next."""
        self._renew_attempt()
        if self._scope is not None:
            self._scope.cancel()

    def stop(self) -> None:
        self._stopping = True
        self._stopped.set()
        self.restart()

    async def _live(self) -> bool:
        """One life of the server; whether it started (listed its tools)."""
        ended = anyio.Event()
        started = False
        params = StdioServerParameters(
            command=self.config.command, args=self.config.args, env=self.config.env
        )
        with anyio.CancelScope() as scope:
            self._scope = scope
            scope.deadline = anyio.current_time() + self._start_timeout_s
            try:
                async with Client(_watched(params, self._errlog, ended)) as client:
                    tools = await _all_tools(client)
                    scope.deadline = math.inf
                    if not self.tools:
                        self.tools = tools
                    self._client, self.problem, started = client, None, True
                    self._settle()
                    log.info("MCP server %r serving %d tools", self.config.name, len(tools))
                    await ended.wait()
                    self._renew_attempt()  # calls wait while it is taken down and started again
            except Exception as exc:
                if started:
                    log.warning("MCP server %r failed: %s", self.config.name, describe(exc))
                else:
                    self.problem = f"did not start: {describe(exc)}"
            finally:
                self._client = None
        self._scope = None
        if scope.cancelled_caught and not started and not self._stopping:
            self.problem = f"did not start: no answer within {self._start_timeout_s:g} s"
        return started

    def _renew_attempt(self) -> None:
        self._client = None
        if self._attempt is None or self._attempt.done():
            self._attempt = asyncio.get_running_loop().create_future()

    def _settle(self) -> None:
        self.first_attempt_ended.set()
        if self._attempt is not None and not self._attempt.done():
            self._attempt.set_result(None)


async def _all_tools(client: Client) -> list[types.Tool]:
    listed = await client.list_tools()
    tools = list(listed.tools)
    while listed.next_cursor:
        listed = await client.list_tools(cursor=listed.next_cursor)
        tools += listed.tools
    return tools


def describe(exc: BaseException) -> str:
    """What went wrong, from the first real error inside any exception groups."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    if isinstance(exc, MCPError) and exc.code == CONNECTION_CLOSED:
        return "it exited or closed its output (its stderr is in the worker's log)"
    return str(exc) or type(exc).__name__


@asynccontextmanager
async def _watched(
    params: StdioServerParameters, errlog: TextIO, ended: anyio.Event
) -> AsyncIterator[tuple[_EndWatch, Any]]:
    """The SDK's stdio transport, with ``ended`` set when the server's output ends."""
    async with stdio_client(params, errlog=errlog) as (read_stream, write_stream):
        yield _EndWatch(read_stream, ended), write_stream


class _EndWatch:
    """A read stream that tells when it has ended: the server exited while idle, say."""

    def __init__(self, inner: Any, ended: anyio.Event) -> None:
        self._inner = inner
        self._ended = ended

    async def receive(self) -> SessionMessage | Exception:
        try:
            item: SessionMessage | Exception = await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._ended.set()
            raise
        return item

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __aiter__(self) -> _EndWatch:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> _EndWatch:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
