"""A worker process's MCP servers: one event loop in a thread of its own holds every server's
session, and the thread that runs tool calls waits on it.

A worker process runs one call at a time, synchronously, and Celery stops a call that passes its
soft limit by raising in that thread. Waiting on a future of the loop's lets that exception end
the wait; the request is then cancelled on the loop, which tells the server (MCP's
``notifications/cancelled``), and a server that no longer answers a ping is restarted.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from collections.abc import Sequence
from typing import Any

import mcp_types as types

from worker.contract.mcp_servers import McpServerConfig
from worker.mcp.connection import START_TIMEOUT_S, ServerConnection

log = logging.getLogger(__name__)
#: How long stopping waits for the servers to exit (the SDK kills a server that lingers).
STOP_TIMEOUT_S = 10.0


class McpHost:
    """The servers of ``servers``, kept running from ``start`` until ``stop``."""

    def __init__(
        self, servers: Sequence[McpServerConfig], *, start_timeout_s: float = START_TIMEOUT_S
    ) -> None:
        self.start_timeout_s = start_timeout_s
        self.connections = {
            s.name: ServerConnection(s, start_timeout_s=start_timeout_s) for s in servers
        }
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._run_loop, name="toolq-mcp", daemon=True)
        self._runners: list[concurrent.futures.Future[None]] = []

    def start(self) -> None:
        """Begin starting every server; returns at once."""
        self._thread.start()
        for connection in self.connections.values():
            self._runners.append(
                asyncio.run_coroutine_threadsafe(connection.keep_running(), self._loop)
            )

    def wait_started(self) -> None:
        """Return once every server has started or failed to (bounded by the start timeout)."""

        async def first_attempts() -> None:
            ended = [
                asyncio.create_task(c.first_attempt_ended.wait()) for c in self.connections.values()
            ]
            _, late = await asyncio.wait(ended, timeout=self.start_timeout_s)
            for waiter in late:
                waiter.cancel()

        if self.connections:
            asyncio.run_coroutine_threadsafe(first_attempts(), self._loop).result()

    def unavailable(self) -> dict[str, str]:
        """The servers that are not running, by name, and why."""
        return {
            name: connection.problem
            for name, connection in self.connections.items()
            if connection.problem is not None
        }

    def call(
        self, server: str, tool: str, arguments: dict[str, Any], wait_s: float
    ) -> types.CallToolResult:
        """Call ``tool`` of ``server`` and wait at most ``wait_s`` for its answer. Whatever ends
        the wait early (the call's soft time limit) cancels the request on the server."""
        connection = self.connections[server]
        future = asyncio.run_coroutine_threadsafe(connection.call(tool, arguments), self._loop)
        try:
            return future.result(timeout=wait_s)
        except BaseException:
            if not future.done():
                future.cancel()
                asyncio.run_coroutine_threadsafe(connection.check_alive(), self._loop)
            raise

    def stop(self) -> None:
        """Stop every server and the loop; bounded by ``STOP_TIMEOUT_S``."""
        if not self._thread.is_alive():
            return
        for connection in self.connections.values():
            self._loop.call_soon_threadsafe(connection.stop)
        concurrent.futures.wait(self._runners, timeout=STOP_TIMEOUT_S)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=STOP_TIMEOUT_S)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self._loop)
        try:
            self._loop.run_forever()
        finally:
            self._loop.close()
