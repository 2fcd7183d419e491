"""One tool call run on this process's tools: checked, run, capped, its usage and its workspace's
growth accounted. A worker's executor runs each delivery through it (``worker.executor``, which
adds the start marker and the stored answer); an orchestrator's in-process tools run through it
too (``worker.in_process``), so a call gets the same caps, limits, quota and errors
wherever it runs."""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import InitVar, dataclass, field
from pathlib import Path

from worker.contract.errors import EnvironmentLost, SessionLost
from worker.contract.limits import cap_text
from worker.contract.network import NETWORK_ALLOWED_VARIABLE, NONE, NetworkPolicy
from worker.contract.settings import WorkerSettings
from worker.contract.wire import POOLS, Pool, ToolCallRequest, ToolCallResult
from worker.exceptions import IdentityError, NotAdmitted, TimeLimitReached, WorkspaceGone
from worker.mcp.hosting import hosted_tools
from worker.quota import WorkspaceQuota
from worker.retention import hold
from worker.sandbox import SandboxConfig, SandboxError
from worker.tools.environment_service import image_tools
from worker.tools.factory import create_fleet_tool_registry, prepare_workspace
from worker.tools.interface import ExecutableTool
from worker.tools.registry import ToolRegistry
from worker.tools.runtime import (
    CallRuntime,
    CurrentWorkspace,
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


def timed_out(request: ToolCallRequest, worker: str) -> ToolCallResult:
    """The answer to a call stopped at its time limit, wherever it ran."""
    return ToolCallResult.failure(
        request,
        "timeout",
        f"Error: {request.tool} timed out after {request.timeout_ms} ms and was stopped.",
        worker,
    )


def build_registry(
    settings: WorkerSettings,
    passthrough: tuple[type[BaseException], ...] = (),
    pools: Iterable[Pool] = POOLS,
) -> ToolRegistry:
    """Built-in tools, plugins and the tools of the MCP servers of ``pools``, as every worker of
    this fleet has them: built once per process, each tool acting on the workspace and
    conversation of the call in hand."""
    # A call refused admission leaves its tool as it is: the executor answers it.
    # So is a call whose run's container is gone (``environment_lost``), or its shell session
    # (``session_lost``).
    registry = ToolRegistry(
        passthrough=(*passthrough, NotAdmitted, EnvironmentLost, SessionLost), sync_in_thread=False
    )
    workspace = CurrentWorkspace()
    create_fleet_tool_registry(settings, current_context(), workspace, registry)
    sandbox = SandboxConfig.from_settings(settings)
    for tool in service_tools(workspace, sandbox, settings.transfer_max_bytes):
        registry.register(tool)
    for tool in image_tools():
        registry.register(tool)
    for tool in hosted_tools(settings, pools):
        registry.register(tool)
    # The caller decides what is enabled; a worker runs whatever reaches its pool.
    for name in registry.get_tool_names():
        registry.enable(name)
    return registry


@dataclass(eq=False)
class CallRunner:
    """Runs calls on the tools of one process, answering as ``worker_name``. ``time_limit``
    names the exception the host raises when a call's soft limit passes, so it can travel
    through the registry untouched."""

    settings: WorkerSettings
    worker_name: str
    time_limit: tuple[type[BaseException], ...] = (TimeLimitReached,)
    clock: Callable[[], float] = time.time
    pools: InitVar[Iterable[Pool]] = POOLS
    #: Every tool of the process, whatever its pool.
    registry: ToolRegistry = field(init=False)
    _sandbox: SandboxConfig = field(init=False)
    # One loop per process, for coroutine tools: a new loop per call would cost more than a
    # small tool does.
    _loop: asyncio.AbstractEventLoop = field(default_factory=asyncio.new_event_loop, init=False)
    _workspaces: OrderedDict[str, Workspace] = field(default_factory=OrderedDict, init=False)
    _quota: WorkspaceQuota = field(init=False)

    def __post_init__(self, pools: Iterable[Pool]) -> None:
        self._sandbox = SandboxConfig.from_settings(self.settings)
        self.registry = build_registry(self.settings, self.time_limit, pools)
        self._quota = WorkspaceQuota(
            self.settings.workspace_root, self.settings.workspace_quota_bytes
        )

    def close(self) -> None:
        """Close the loop of coroutine tools: the process runs no more calls."""
        self._loop.close()

    def run(
        self,
        request: ToolCallRequest,
        pool: str | None,
        admit: Callable[[], None] | None = None,
        loop: asyncio.AbstractEventLoop | None = None,
    ) -> ToolCallResult:
        """Run ``request`` as the pool ``pool`` serves it, in its run's workspace, held for the
        call. ``admit`` waits until a call with effects may start them (raising
        ``NotAdmitted``); ``loop`` runs coroutine tools (the process's own by default)."""
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
            runtime = CallRuntime(
                workspace,
                request.context,
                admit=admit,
                workspace_lock=held,
                environment=request.environment,
                network=NetworkPolicy.parse(request.network),
                limits=request.limits,
            )
            with running(runtime):
                result = self._run(request, pool, runtime, loop or self._loop)
        finally:
            os.close(held)
        result.duration_ms = round((time.perf_counter() - started) * 1000, 3)
        return result

    def _run(
        self,
        request: ToolCallRequest,
        pool: str | None,
        runtime: CallRuntime,
        loop: asyncio.AbstractEventLoop,
    ) -> ToolCallResult:
        tool = self.registry.get(request.tool)
        if self.clock() > request.deadline:
            return ToolCallResult.failure(
                request,
                "timeout",
                f"Error: {request.tool} was not started: its deadline passed while it waited in "
                "the queue.",
                self.worker_name,
            )
        network_refusal = self.settings.network_allowance.refusal(
            runtime.network or NONE, NETWORK_ALLOWED_VARIABLE
        )
        if network_refusal is not None:
            # The orchestrator refuses such a run before it starts; a message that says more
            # than the fleet allows did not come from one.
            return ToolCallResult.failure(
                request, "bad_request", f"Error: {network_refusal}.", self.worker_name
            )
        if request.tool in self.settings.disabled_tools:
            return ToolCallResult.failure(
                request,
                "tool_disabled",
                f"Error: tool {request.tool!r} is not available (disabled on this fleet).",
                self.worker_name,
            )
        over = self._over_limits(request)
        if over is not None:
            return over
        if tool is not None:
            refusal = self._refusal(request, tool, pool)
            if refusal is not None:
                return refusal
            if not tool.admits_itself:
                admit_current_call()
        try:
            outcome = self.registry.run_blocking(request.tool, request.arguments, loop)
        except EnvironmentLost as exc:
            return ToolCallResult.failure(
                request,
                "environment_lost",
                f"Error: environment lost: {exc}. Nothing of {request.tool} ran.",
                self.worker_name,
            )
        except SessionLost as exc:
            return ToolCallResult.failure(
                request, "session_lost", f"Error: {exc}. Nothing was typed.", self.worker_name
            )
        except self.time_limit:
            return timed_out(request, self.worker_name)
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
            holder=runtime.holder,
        )

    def _over_limits(self, request: ToolCallRequest) -> ToolCallResult | None:
        """The refusal of a call whose run asks more than this fleet allows: its caller checks
        too, before the run starts; a worker holds the line whoever sent the call."""
        if request.limits is None:
            return None
        settings = self.settings
        over = settings.limits_max.refusal(request.limits, settings.max_timeout_ms)
        if over is None:
            return None
        return ToolCallResult.failure(
            request,
            "bad_request",
            f"Error: {request.tool} was not started: {over}.",
            self.worker_name,
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
            workspace = self.workspace(run_id)
            try:
                return workspace, hold(workspace.root)
            except WorkspaceGone:
                self._workspaces.pop(run_id, None)
        raise WorkspaceGone(f"the workspace of run {run_id} keeps being removed")

    def workspace(self, run_id: str) -> Workspace:
        """The workspace of run ``run_id``, made ready as its calls find it."""
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
