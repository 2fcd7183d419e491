"""One tool call on a worker: check, run once, cap, store, answer. Knows nothing of Celery.

The call itself runs through ``worker.call_runner`` (as an orchestrator's in-process calls do);
this module adds what a delivery through a broker needs: the start marker, at most one run of a
call with effects, the stored and sealed answer."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from typing import Any

from pydantic import ValidationError

from worker.call_runner import CallRunner, build_registry
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.contract.wire import POOLS, Pool, ToolCallRequest, ToolCallResult
from worker.exceptions import NotAdmitted, NotRunHere, TimeLimitReached
from worker.plumbing.log_context import log_context
from worker.results import PendingBegin, ResultStore

__all__ = ["Executor", "NotRunHere", "TimeLimitReached", "build_registry"]

log = logging.getLogger(__name__)


def _admit(marker: PendingBegin) -> None:
    """A call with effects starts only as its first run, its start marker stored."""
    begin = marker.result()
    if begin.stored is not None or begin.previous is not None or begin.held_by is not None:
        raise NotAdmitted


@dataclass(eq=False)
class Executor:
    """Runs requests for one worker process. ``time_limit`` names the exception the host raises
    when a call's soft limit passes, so it can travel through the registry untouched."""

    settings: WorkerSettings
    store: ResultStore
    worker_name: str
    time_limit: tuple[type[BaseException], ...] = (TimeLimitReached,)
    clock: Callable[[], float] = time.time
    pools: InitVar[Iterable[Pool]] = POOLS
    #: Runs each call once it may run; its workspaces and tools are this process's.
    runner: CallRunner = field(init=False)

    def __post_init__(self, pools: Iterable[Pool]) -> None:
        self.runner = CallRunner(
            self.settings, self.worker_name, self.time_limit, self.clock, pools
        )

    def handle(self, raw: Any, pool: str | None, node: str | None = None) -> ToolCallResult:
        """Answer one message from the queue of ``pool``, taken by the Celery worker ``node``
        (named in the call's start marker); never raises for bad input."""
        try:
            request = ToolCallRequest.model_validate(raw)
        except ValidationError as exc:
            return self._reject_bad_request(raw, exc)
        with log_context(run_id=request.run_id, tool_call_id=request.tool_call_id):
            return self._handle(request, pool, node)

    def _handle(
        self, request: ToolCallRequest, pool: str | None, node: str | None = None
    ) -> ToolCallResult:
        tool = self.runner.registry.get(request.tool)
        # Every call marks its start, so that a caller with no answer knows whether it may have
        # run. Tools safe to repeat run whatever the marker says, and the store keeps their
        # first answer. The others run at most once: a finished call is answered from the
        # store, and a call cut short elsewhere is found by its start marker. The marker's
        # round trip overlaps the call's preparation; nothing of a call with effects starts
        # before its answer is back (``admit``).
        gated = tool is not None and not tool.idempotent
        # A store that refuses for a while is asked again for as long as the caller waits.
        marker = self.store.begin_ahead(
            request.task_id,
            self.worker_name,
            request.send_number,
            deadline=request.deadline,
            node=node,
        )
        try:
            admit = functools.partial(_admit, marker) if gated else None
            result = self.runner.run(request, pool, admit)
        except NotAdmitted:
            result = None
        except BaseException:
            marker.discard()
            raise
        begin = marker.result()
        if begin.stored is not None:
            self.store.reply_again(begin.stored, request.reply_to, deadline=request.deadline)
            return begin.stored
        if tool is None or not gated:
            assert result is not None  # only a call with effects waits for admission
            return self.store.store(result, request.reply_to, deadline=request.deadline)
        if begin.held_by is not None:
            raise NotRunHere(f"the call is held by {begin.held_by}")
        if begin.previous is not None:
            result = ToolCallResult.failure(
                request,
                "interrupted",
                f"Error: {tool.name} was interrupted (worker {begin.previous} stopped mid-call); "
                "its outcome is unknown and it was not run again because it has effects.",
                self.worker_name,
            )
        assert result is not None  # only a stored answer or a cut call refuses admission
        return self.store.store(result, request.reply_to, deadline=request.deadline)

    def store_timeout(self, raw: Any, limit_s: float) -> None:
        """The worker child was replaced past the hard limit: answer for it."""
        try:
            request = ToolCallRequest.model_validate(raw)
        except ValidationError:
            return
        result = ToolCallResult.failure(
            request,
            "timeout",
            f"Error: {request.tool} did not stop by its hard time limit of {limit_s:g} s; "
            "the worker process running it was replaced.",
            self.worker_name,
        )
        # One try, with no wait: this runs in the worker's main process, whose event loop takes
        # the calls and must not stop for a store that refuses.
        self.store.store(result, request.reply_to)

    def _reject_bad_request(self, raw: Any, exc: ValidationError) -> ToolCallResult:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}"
            for e in exc.errors(include_url=False)
        )
        data = raw if isinstance(raw, dict) else {}
        result = ToolCallResult(
            task_id=str(data.get("task_id") or "unknown"),
            tool=str(data.get("tool") or "unknown"),
            output=f"Error: the worker received an invalid request ({fields}).",
            is_error=True,
            error_kind="bad_request",
            worker=self.worker_name,
        )
        reply_to = data.get("reply_to")
        if isinstance(reply_to, str) and keys.is_reply(reply_to):
            # Sealed, so that its caller takes it: the key is the fleet's and the call's id.
            self.store.reply_again(self.store.sealed(result), reply_to)
        log.error("invalid tool call request: %s", fields)
        return result
