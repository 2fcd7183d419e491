"""What one call runs with: its run's workspace and conversation.

A worker builds its tools once per process; the executor sets the call's runtime around each
call, and the tools' workspace and context, being views of it, act on the call in hand.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass

from worker.contract.network import NetworkPolicy
from worker.contract.run_limits import RunLimits
from worker.contract.wire import ResourceUsage, ToolContextSnapshot
from worker.tools.context import ToolContext
from worker.tools.paths import _Location
from worker.tools.workspace import Workspace


@dataclass(slots=True)
class CallRuntime:
    """The run a call belongs to: where it works and what the conversation holds; and what the
    call reports besides its answer (what its command used)."""

    workspace: Workspace
    context: ToolContextSnapshot
    usage: ResourceUsage | None = None
    #: The queue of the worker holding the run's shell sessions, once a session call ran.
    holder: str | None = None
    #: Waits until the call may start its effects, raising ``NotAdmitted`` if it may not (see
    #: ``admit_current_call``); None: nothing to wait for.
    admit: Callable[[], None] | None = None
    #: The descriptor by which the call holds its workspace (``worker.retention.hold``), which
    #: the removal of the workspace turns exclusive; None outside a worker.
    workspace_lock: int | None = None
    #: The run's container, which its commands run in (``worker.images``); None: no image.
    environment: str | None = None
    #: The run's network (``worker.egress``); None: loopback alone.
    network: NetworkPolicy | None = None
    #: The run's own limits for its commands (``worker.contract.run_limits``); None: defaults.
    limits: RunLimits | None = None


_current: ContextVar[CallRuntime] = ContextVar("toolq_call_runtime")


def current_runtime() -> CallRuntime:
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError(
            "no tool call is running: tools built for a worker act only inside one"
        ) from None


@contextmanager
def running(runtime: CallRuntime) -> Iterator[None]:
    """Make ``runtime`` the current call's for the duration of the block."""
    token = _current.set(runtime)
    try:
        yield
    finally:
        _current.reset(token)


def admit_current_call() -> None:
    """Wait until the running call may start its effects (its start marker is stored); raises
    ``NotAdmitted`` when it may not. Nothing outside a worker's call."""
    runtime = _current.get(None)
    if runtime is not None and runtime.admit is not None:
        runtime.admit()


def current_limits() -> RunLimits | None:
    """The limits the running call's run asked for its commands; None: the worker's defaults,
    or outside a call."""
    runtime = _current.get(None)
    return None if runtime is None else runtime.limits


def current_network() -> NetworkPolicy | None:
    """The network the running call's commands get; None without one, or outside a call."""
    runtime = _current.get(None)
    return None if runtime is None else runtime.network


def current_environment() -> str | None:
    """The container the running call's commands run in (its run's image); None without one,
    or outside a worker's call."""
    runtime = _current.get(None)
    return None if runtime is None else runtime.environment


def report_holder(queue: str) -> None:
    """Tell the call's result which worker's queue holds the run's shell sessions."""
    runtime = _current.get(None)
    if runtime is not None:
        runtime.holder = queue


def report_usage(usage: ResourceUsage) -> None:
    """Tell the call's result what its command used; nothing outside a worker's call."""
    runtime = _current.get(None)
    if runtime is not None:
        runtime.usage = usage


class CurrentWorkspace(Workspace):
    """The workspace of whichever call is running: tools built once serve every run."""

    def __init__(self) -> None:
        self._where = None

    @property
    def _location(self) -> _Location:
        return current_runtime().workspace._location


def current_context() -> ToolContext:
    """The conversation of whichever call is running."""
    return ToolContext(source=lambda: current_runtime().context)
