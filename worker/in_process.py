"""A run's calls answered in this process, for an orchestrator with no broker and no workers
(``in_process=True``): each call goes through the same ``CallRunner`` as on a worker, so its
cap, time limit, quota, usage and errors are the fleet's.

``LocalCalls`` stands where a dispatcher stands: the caller builds each request and awaits
``call``, and the tools it offers the model are the fleet's specs (``specs``).
"""

from __future__ import annotations

import asyncio
from typing import Unpack

from worker.call_runner import CallRunner, timed_out
from worker.contract.deadlines import CallFields, limited_request
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallRequest, ToolCallResult, ToolSpec
from worker.manifest import tool_specs
from worker.tools.registry import run_in_daemon_thread


class LocalCalls:
    """Runs the calls of this process's conversations on the tools a worker with ``settings``
    serves, answering as ``worker_name``."""

    def __init__(self, settings: WorkerSettings, worker_name: str) -> None:
        self._runner = CallRunner(settings, worker_name)
        #: The tools as a worker publishes them, service operations included.
        self.specs: list[ToolSpec] = tool_specs(self._runner.registry, settings)

    def close(self) -> None:
        """No more calls: the runner's own loop is closed."""
        self._runner.close()

    def build_request(self, spec: ToolSpec, **call: Unpack[CallFields]) -> ToolCallRequest:
        """A request whose limit follows the fleet's rule; no queue lies between it and its
        run, so its deadline is its limit."""
        return limited_request(self._runner.settings, spec, now=self._runner.clock(), **call)

    async def call(self, request: ToolCallRequest, pool: str) -> ToolCallResult:
        """Run one call in a thread of its own and answer it; at its time limit it is answered
        as timed out, as a worker answers it. Nothing can stop a thread: one past its limit is
        left to finish on its own, and its answer is dropped."""
        # Each call has its own loop for coroutine tools: calls of one turn run at once.
        loop = asyncio.new_event_loop()

        def run() -> ToolCallResult:
            try:
                return self._runner.run(request, pool, loop=loop)
            finally:
                loop.close()

        try:
            async with asyncio.timeout(request.timeout_ms / 1000) as limit:
                answer: ToolCallResult = await run_in_daemon_thread(run)
                return answer
        except TimeoutError:
            if not limit.expired():
                raise
            return timed_out(request, self._runner.worker_name)
