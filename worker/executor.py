"""One tool call on a worker: check, run once, cap, store, answer. Knows nothing of Celery."""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from worker.contract.errors import ToolqError
from worker.contract.image_errors import EnvironmentLost
from worker.contract.keys import keys
from worker.contract.limits import cap_text
from worker.contract.runtime.log_context import log_context
from worker.contract.settings import WorkerSettings
from worker.contract.wire import POOLS, Pool, ToolCallRequest, ToolCallResult
from worker.images.service import image_tools
from worker.mcp.hosting import hosted_tools
from worker.quota import WorkspaceQuota
from worker.results import PendingBegin, ResultStore
from worker.retention import WorkspaceGone, hold
from worker.sandbox import SandboxConfig, SandboxError
from worker.sandbox.identity import IdentityError
from worker.tools.factory import create_fleet_tool_registry, prepare_workspace
from worker.tools.interface import ExecutableTool
from worker.tools.registry import ToolRegistry
from worker.tools.runtime import (
    CallRuntime,
    CurrentWorkspace,
    NotAdmitted,
    admit_current_call,
    current_context,
    running,
)
from worker.tools.service import service_tools
from worker.tools.workspace import Workspace, WorkspaceError

log = logging.getLogger(__name__)
_WORKSPACES_KEPT = 1024
#: Tries at holding a run's workspace that is being removed as the call comes (see
#: ``worker.retention``): the second finds it gone and makes it anew.
_HOLD_TRIES = 3


class TimeLimitReached(ToolqError):
    """Raised into a running tool when its soft time limit passes (mapped from Celery's)."""


class NotRunHere(ToolqError):
    """This delivery neither ran nor answered its call, which another holds: a message of the
    call that started it (the caller sent the call again), or the caller, which stopped waiting."""


def _admit(marker: PendingBegin) -> None:
    """A call with effects starts only as its first run, its start marker stored."""
    begin = marker.result()
    if begin.stored is not None or begin.previous is not None or begin.held_by is not None:
        raise NotAdmitted


def build_registry(
    settings: WorkerSettings,
    passthrough: tuple[type[BaseException], ...] = (),
    pools: Iterable[Pool] = POOLS,
) -> ToolRegistry:
    """Built-in tools, plugins and the tools of the MCP servers of ``pools``, as every worker of
    this fleet has them: built once per process, each tool acting on the workspace and
    conversation of the call in hand."""
    # A call refused admission leaves its tool as it is: the executor answers it.
    # So is a call whose run's container is gone (``environment_lost``).
    registry = ToolRegistry(
        passthrough=(*passthrough, NotAdmitted, EnvironmentLost), sync_in_thread=False
    )
    workspace = CurrentWorkspace()
    create_fleet_tool_registry(settings, current_context(), workspace, registry)
    sandbox = SandboxConfig.from_settings(settings)
    for tool in service_tools(workspace, sandbox, settings.transfer_max_bytes):
        registry.register(tool)
    for tool in image_tools(workspace):
        registry.register(tool)
    for tool in hosted_tools(settings, pools):
        registry.register(tool)
    # The caller decides what is enabled; a worker runs whatever reaches its pool.
    for name in registry.get_tool_names():
        registry.enable(name)
    return registry


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
    _sandbox: SandboxConfig = field(init=False)
    # One loop per process, for coroutine tools: a new loop per call would cost more than a
    # small tool does.
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop, init=False)
    _workspaces: OrderedDict[str, Workspace] = field(default_factory=OrderedDict, init=False)
    _registry: ToolRegistry = field(init=False)
    _quota: WorkspaceQuota = field(init=False)

    def __post_init__(self, pools: Iterable[Pool]) -> None:
        self._sandbox = SandboxConfig.from_settings(self.settings)
        self._registry = build_registry(self.settings, self.time_limit, pools)
        self._quota = WorkspaceQuota(
            self.settings.workspace_root, self.settings.workspace_quota_bytes
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
        tool = self._registry.get(request.tool)
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
            result = self._held_run(request, pool, tool, marker if gated else None)
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

    def _held_run(
        self,
        request: ToolCallRequest,
        pool: str | None,
        tool: ExecutableTool | None,
        marker: PendingBegin | None,
    ) -> ToolCallResult:
        started = time.perf_counter()
        # Held for the call: touched (the run is in use) and safe from removal until it ends.
        try:
            workspace, held = self._hold(request.run_id)
        except (OSError, IdentityError, WorkspaceError, SandboxError) as exc:
            log.error("the workspace of run %s could not be made ready: %s", request.run_id, exc)
            return ToolCallResult.failure(
                request,
                "workspace_unavailable",
                f"Error: {request.tool} did not run: the run's workspace could not be made "
                f"ready on this worker ({exc}).",
                self.worker_name,
            )
        try:
            admit = None if marker is None else functools.partial(_admit, marker)
            runtime = CallRuntime(
                workspace,
                request.context,
                admit=admit,
                workspace_lock=held,
                environment=request.environment,
            )
            with running(runtime):
                result = self._run(request, pool, tool, runtime)
        finally:
            os.close(held)
        result.duration_ms = round((time.perf_counter() - started) * 1000, 3)
        return result

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

    def _run(
        self,
        request: ToolCallRequest,
        pool: str | None,
        tool: ExecutableTool | None,
        runtime: CallRuntime,
    ) -> ToolCallResult:
        if self.clock() > request.deadline:
            return ToolCallResult.failure(
                request,
                "timeout",
                f"Error: {request.tool} was not started: its deadline passed while it waited in "
                "the queue.",
                self.worker_name,
            )
        if request.tool in self.settings.disabled_tools:
            return ToolCallResult.failure(
                request,
                "tool_disabled",
                f"Error: tool {request.tool!r} is not available (disabled on this fleet).",
                self.worker_name,
            )
        if tool is not None:
            refusal = self._refusal(request, tool, pool)
            if refusal is not None:
                return refusal
            if not tool.admits_itself:
                admit_current_call()
        try:
            outcome = self._registry.run_blocking(request.tool, request.arguments, self._loop)
        except EnvironmentLost as exc:
            return ToolCallResult.failure(
                request,
                "environment_lost",
                f"Error: environment lost: {exc}. Nothing of {request.tool} ran.",
                self.worker_name,
            )
        except self.time_limit:
            return ToolCallResult.failure(
                request,
                "timeout",
                f"Error: {request.tool} timed out after {request.timeout_ms} ms and was stopped.",
                self.worker_name,
            )
        output, truncated = outcome.output, outcome.truncated
        if tool is None or not tool.caps_own_output:
            output, cut = cap_text(output, self.settings.output_cap_bytes)
            truncated = truncated or cut
        if tool is not None and tool.workspace_effect != "none":
            notice = self._quota.account(request.run_id, runtime.workspace.root)
            if notice is not None:
                output = tool.with_notice(output, notice)
        return ToolCallResult(
            task_id=request.task_id,
            tool=request.tool,
            output=output,
            is_error=outcome.is_error,
            error_kind=outcome.error_kind,
            truncated=truncated,
            worker=self.worker_name,
            usage=runtime.usage,
        )

    def _refusal(
        self, request: ToolCallRequest, tool: ExecutableTool, pool: str | None
    ) -> ToolCallResult | None:
        if tool.pool != pool:
            return ToolCallResult.failure(
                request,
                "wrong_pool",
                f"Error: tool {tool.name!r} runs only on the {tool.pool!r} pool; this worker "
                f"serves {pool!r}. The call was refused.",
                self.worker_name,
            )
        if tool.workspace_effect == "adds" and not tool.only_shrinks(request.arguments):
            full = self._quota.refusal(request.run_id)
            if full is not None:
                return ToolCallResult.failure(
                    request,
                    "over_quota",
                    f"Error: {tool.name} was not started: {full}.",
                    self.worker_name,
                )
        return None

    def _hold(self, run_id: str) -> tuple[Workspace, int]:
        """The run's workspace and a descriptor holding it (``worker.retention.hold``)."""
        for _ in range(_HOLD_TRIES):
            workspace = self._workspace(run_id)
            try:
                return workspace, hold(workspace.root)
            except WorkspaceGone:
                self._workspaces.pop(run_id, None)
        raise WorkspaceGone(f"the workspace of run {run_id} keeps being removed")

    def _workspace(self, run_id: str) -> Workspace:
        # Kept per run: a conversation's calls keep coming to the same few processes, and
        # resolving a root costs more than a small tool. A root removed since is made again.
        known = self._workspaces.get(run_id)
        # With run volumes, a folder no longer mounted (the host restarted) is mounted again.
        volumes = bool(self._sandbox.volume_bytes) and self._sandbox.per_run_uids
        mounted = not volumes or os.path.ismount(known.root) if known else False
        if known is not None and os.path.isdir(known.root) and mounted:
            self._workspaces.move_to_end(run_id)
            return known
        # The run's own folder, not those above it: run_bash's user works only in here.
        workspace = prepare_workspace(Path(self.settings.workspace_root) / run_id, self._sandbox)
        self._workspaces[run_id] = workspace
        if len(self._workspaces) > _WORKSPACES_KEPT:
            self._workspaces.popitem(last=False)
        return workspace

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
