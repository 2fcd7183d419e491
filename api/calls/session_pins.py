"""The runs whose sandbox calls must reach the worker holding their shell sessions.

A bash_session answer names the queue of the worker that holds the run's shells
(``ToolCallResult.holder``); the run's later sandbox calls go there, as an image run's go to its
container's worker (``api.calls.pins``), which a run with an image keeps. Once that worker no
longer announces itself, the run's sessions are lost with it: its next session call answers
``session_lost`` (until one asks for a ``restart``), never a new shell on another worker, and
its other sandbox calls go to any worker again.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import redis.asyncio as aioredis

from api.calls.pins import announces_itself
from worker.contract.errors import RESTART_HINT
from worker.contract.wire import ToolCallRequest, ToolCallResult

#: The tool whose answers pin a run, and whose calls a lost session answers.
SESSION_TOOL = "bash_session"
#: The pool whose calls a session pin redirects.
_POOL = "sandbox"
#: The prefix of a sandbox worker's own queue (``worker.images.owner.PINNED_PREFIX``).
_OWN_QUEUE = "sandbox."
#: Runs remembered at most: the least recently used are forgotten first (their sessions end
#: with their workers' idle time anyway).
MAX_RUNS = 100_000


@dataclass(slots=True)
class _Holder:
    queue: str
    lost: bool = False

    @property
    def node(self) -> str:
        return self.queue.removeprefix(_OWN_QUEUE)


class SessionPins:
    """The holders of one dispatcher's runs' sessions."""

    def __init__(self) -> None:
        self._holders: OrderedDict[str, _Holder] = OrderedDict()

    def holder(self, run_id: str) -> str | None:
        """The queue of the worker that holds the run's sessions, while it does."""
        found = self._holders.get(run_id)
        return None if found is None or found.lost else found.queue

    def forget(self, run_id: str) -> None:
        self._holders.pop(run_id, None)

    async def place(
        self, request: ToolCallRequest, pool: str, redis: aioredis.Redis
    ) -> tuple[ToolCallRequest, str] | ToolCallResult:
        """Where ``request`` goes: its run's session holder's queue, or as it is; or the answer
        that the run's sessions are lost."""
        found = self._holders.get(request.run_id)
        if found is None or pool != _POOL:
            return request, pool
        self._holders.move_to_end(request.run_id)
        if not found.lost:
            found.lost = not await announces_itself(redis, _POOL, found.node)
        if not found.lost:
            return request, found.queue
        if request.tool != SESSION_TOOL:
            return request, pool
        if _action(request) == "restart":
            self.forget(request.run_id)  # a new shell, wherever the call goes
            return request, pool
        return self._lost(request, found)

    def settle(
        self, request: ToolCallRequest, queue: str, result: ToolCallResult
    ) -> ToolCallResult:
        """Learn from an answer where the run's sessions are, or that they are gone; the answer,
        or for a session call that its holder's worker never took, ``session_lost``."""
        found = self._holders.get(request.run_id)
        if result.holder is not None:
            self._holders[request.run_id] = _Holder(result.holder)
            self._holders.move_to_end(request.run_id)
            while len(self._holders) > MAX_RUNS:
                self._holders.popitem(last=False)
        elif found is not None and result.error_kind == "session_lost":
            found.lost = True
        elif found is not None and queue == found.queue and result.error_kind == "no_answer":
            # Sent to the holder's own queue, and nobody took it: its worker stopped.
            found.lost = True
            if request.tool == SESSION_TOOL:
                return self._lost(request, found)
        return result

    def _lost(self, request: ToolCallRequest, found: _Holder) -> ToolCallResult:
        return ToolCallResult.failure(
            request,
            "session_lost",
            f"Error: session lost: the worker {found.node} that held the run's shell sessions "
            f"is gone, and everything the shells held went with it; {RESTART_HINT}. Nothing "
            "was typed.",
        )


def _action(request: ToolCallRequest) -> str | None:
    arguments: Any = request.arguments
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None  # the worker refuses it, in one line
    if isinstance(arguments, dict):
        action = arguments.get("action")
        return action if isinstance(action, str) else None
    return None
