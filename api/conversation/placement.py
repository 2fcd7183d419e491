"""Where a conversation runs and where its tools run: decided here, one way, for ``toolq batch``,
the HTTP API and the ``Agent``; and what each place needs, started here.

A conversation runs here (an ``Agent`` in this process asks the model) or on the agents pool (an
agents worker asks it; this process waits for the answer). Its tools run on the configured
fleet's workers, on a local stack this process starts when no broker is configured, or in this
process.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from enum import StrEnum

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet, load_fleet
from api.calls.run_tools import RunTools, enable_tool
from api.conversation.agent_options import ORCHESTRATOR, AgentOptions
from api.runs.environment import RunEnvironment
from api.settings import OrchestratorSettings
from worker.contract.errors import LimitsRefused, NetworkRefused
from worker.contract.run_limits import RunLimits
from worker.contract.settings import FleetSettings, WorkerSettings, get_worker_settings
from worker.contract.wire import ToolContextSnapshot
from worker.tools.registry import ToolRegistry


class ConversationSite(StrEnum):
    """Where a conversation's loop runs: who asks the model."""

    HERE = "here"
    AGENTS_POOL = "agents_pool"


class ToolSite(StrEnum):
    """Where a conversation's tools run."""

    #: The workers of the configured broker.
    FLEET = "fleet"
    #: No broker configured: a private Redis and a worker per pool, started by this process.
    LOCAL_STACK = "local_stack"
    #: The tools a worker would serve, run in this process: no broker, no workers.
    IN_PROCESS = "in_process"


class AgentsPool(StrEnum):
    """What a caller asks of the agents pool."""

    #: Never: the conversations run here (the ``Agent``, ``toolq batch``).
    UNUSED = "unused"
    #: While an agents worker is live, else here (the HTTP API).
    WHEN_LIVE = "when_live"
    #: There or not at all: with no agents worker live, ``NoAgentsError`` (``--on-fleet``).
    REQUIRED = "required"


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one conversation runs, and where its tools run (``place`` decides)."""

    conversation: ConversationSite
    tools: ToolSite

    @property
    def on_agents_pool(self) -> bool:
        return self.conversation is ConversationSite.AGENTS_POOL

    @property
    def starts_agents_worker(self) -> bool:
        """An agents worker of this process's own asks the model, with this process's
        ``OPENAI_*`` environment."""
        return self.on_agents_pool and self.tools is ToolSite.LOCAL_STACK


def place(
    settings: FleetSettings,
    *,
    agents_pool: AgentsPool = AgentsPool.UNUSED,
    fleet: Fleet | None = None,
    fleet_given: bool = False,
    in_process: bool = False,
) -> Placement:
    """Where a conversation runs and where its tools run.

    ``fleet``: the fleet as last seen, which says whether an agents worker is live; it, or
    ``fleet_given`` (the caller brings a dispatcher of its own), means the tools run on that
    fleet, and nothing is started whatever the settings say. Otherwise, with no broker
    configured, on a local stack. ``in_process``: the tools run in this process.
    """
    if in_process:
        if agents_pool is AgentsPool.REQUIRED:
            raise ValueError("a conversation on the agents pool runs its tools on the fleet")
        tools = ToolSite.IN_PROCESS
    elif settings.local_mode and fleet is None and not fleet_given:
        tools = ToolSite.LOCAL_STACK
    else:
        tools = ToolSite.FLEET
    agents_live = fleet is not None and bool(fleet.agents)
    on_pool = agents_pool is AgentsPool.REQUIRED or (
        agents_pool is AgentsPool.WHEN_LIVE and agents_live and tools is not ToolSite.IN_PROCESS
    )
    return Placement(ConversationSite.AGENTS_POOL if on_pool else ConversationSite.HERE, tools)


@contextlib.contextmanager
def fleet_started(
    settings: OrchestratorSettings, placement: Placement
) -> Iterator[OrchestratorSettings]:
    """The settings of the fleet ``placement`` runs on: ``settings`` as they are, or pointed at
    a local stack that runs for the block (with an agents worker when the conversations run on
    the agents pool)."""
    if placement.tools is not ToolSite.LOCAL_STACK:
        yield settings
        return
    # Local mode is a wing; the core reaches it only in this module, and only when asked to run
    # alone.
    from api.local.stack import local_fleet

    with local_fleet(settings, agents=placement.on_agents_pool) as fleet_settings:
        yield fleet_settings


class ConversationTools:
    """One conversation's tools where ``placement`` puts them, in ``registry``, and what was
    started for them: a local stack, a dispatcher, the run's container. ``close`` ends them.

    ``context`` gives the conversation's state as each call is sent. Fleet tools are proxies
    sent to ``fleet`` (loaded when not given) through ``dispatcher`` (made, and owned, when not
    given). A local stack is this object's until ``close`` or, failing that, until this process
    exits. ``options.enable`` and ``options.disable`` are applied last.
    """

    def __init__(
        self,
        placement: Placement,
        registry: ToolRegistry,
        run_id: str,
        options: AgentOptions,
        context: Callable[[], ToolContextSnapshot],
        *,
        settings: OrchestratorSettings,
        dispatcher: Dispatcher | None = None,
        fleet: Fleet | None = None,
        worker_settings: WorkerSettings | None = None,
    ) -> None:
        self.registry = registry
        #: The settings the tools run with: pointed at the local stack when one was started.
        self.settings = settings
        #: The fleet whose workers run the tools; None when they run in this process.
        self.fleet: Fleet | None = None
        #: With an image: the run's container.
        self.environment: RunEnvironment | None = None
        self._dispatcher = dispatcher
        self._owns_dispatcher = False
        #: The run whose network this object set on the dispatcher (``Dispatcher.networks``).
        self._network_of: str | None = None
        self._local_stack: weakref.finalize[[], ConversationTools] | None = None
        #: In process: ends what runs the calls (``worker.in_process.LocalCalls``).
        self._close_local_calls: Callable[[], None] | None = None
        try:
            if placement.tools is ToolSite.IN_PROCESS:
                self._add_tools_here(run_id, options, context, worker_settings)
            else:
                if placement.tools is ToolSite.LOCAL_STACK:
                    self._start_local_stack(worker_settings or get_worker_settings())
                fleet = fleet or load_fleet(self.settings.redis_url)
                self._add_fleet_tools(fleet, run_id, options, context)
            for name in options.enable:
                self.enable(name)
            for name in options.disable:
                self.registry.disable(name)
        except BaseException:
            if self._local_stack is not None:
                self._local_stack()
            raise

    def enable(self, name: str) -> None:
        """Switch a tool on; ``ValueError`` when there is none such, or no live worker serves
        it."""
        enable_tool(self.registry, self.fleet, name)

    async def close(self) -> None:
        """End the run's container, close the owned dispatcher, stop the local stack or the
        runner of the calls made in process."""
        if self._close_local_calls is not None:
            self._close_local_calls()
            self._close_local_calls = None
        if self.environment is not None:
            await self.environment.end()
        if self._network_of is not None and self._dispatcher is not None:
            self._dispatcher.networks.pop(self._network_of, None)
            self._network_of = None
        if self._owns_dispatcher and self._dispatcher is not None:
            await self._dispatcher.close()
        if self._local_stack is not None and self._local_stack.alive:
            await asyncio.to_thread(self._local_stack)

    def _add_tools_here(
        self,
        run_id: str,
        options: AgentOptions,
        context: Callable[[], ToolContextSnapshot],
        worker_settings: WorkerSettings | None,
    ) -> None:
        """The tools a worker would serve, as proxies of the fleet's kind whose calls run in
        this process through the worker's own runner (caps, limits, quota and errors alike)."""
        if options.image is not None:
            raise ValueError("an image needs a fleet: in_process runs tools here")
        if options.network != "none":
            raise ValueError("a network needs a fleet: in_process runs tools here")
        # The worker floor's machinery is loaded only when asked for: an orchestrator that
        # sends its calls to a fleet never holds the sandbox, images or plugins.
        from worker.in_process import LocalCalls

        local = LocalCalls(worker_settings or get_worker_settings(), ORCHESTRATOR)
        self._close_local_calls = local.close
        RunTools(
            local,
            local.specs,
            run_id,
            context,
            timeout_ms=options.tool_timeout_ms,
            limits=self._checked_limits(options),
            registry=self.registry,
        )

    def _checked_limits(self, options: AgentOptions) -> RunLimits | None:
        """The run's own limits; ``LimitsRefused`` before anything runs where they ask more
        than the fleet allows."""
        if options.limits is None:
            return None
        over = self.settings.limits_max.refusal(options.limits, self.settings.max_timeout_ms)
        if over is not None:
            raise LimitsRefused(over)
        return options.limits

    def _add_fleet_tools(
        self,
        fleet: Fleet,
        run_id: str,
        options: AgentOptions,
        context: Callable[[], ToolContextSnapshot],
    ) -> None:
        """The fleet's tools, as proxies that send each call to a worker."""
        self.fleet = fleet.require_tools()
        refused = self.settings.network_refusal(options.network)
        if refused is not None:
            raise NetworkRefused(refused)
        if self._dispatcher is None:
            self._owns_dispatcher = True
            self._dispatcher = Dispatcher(self.settings)
        if options.network != "none" and run_id not in self._dispatcher.networks:
            # Ours to let go at the end; a batch item's runner set its own before (its setup
            # and check run with the network too).
            self._dispatcher.networks[run_id] = options.network
            self._network_of = run_id
        RunTools(
            self._dispatcher,
            self.fleet.model_tools.values(),
            run_id,
            context,
            fleet=self.fleet,
            timeout_ms=options.tool_timeout_ms,
            limits=self._checked_limits(options),
            registry=self.registry,
        )
        self.environment = RunEnvironment.for_run(self._dispatcher, self.fleet, run_id, options)

    def _start_local_stack(self, worker_settings: WorkerSettings) -> None:
        """The fleet ``toolq run`` would start, this object's until ``close`` (or, failing that,
        until this process exits)."""
        from api.local.stack import LocalStack

        stack = LocalStack(worker_settings)
        self._local_stack = weakref.finalize(self, stack.stop)
        stack.start()
        self.settings = self.settings.with_fleet(stack.settings)
