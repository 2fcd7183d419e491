"""The sandbox environment's way to the fleet: the fleet ``TOOLQ_BROKER_URL`` names, or a local
stack started for the eval when none is set (as ``toolq run`` does), and a ``Dispatcher`` for
each event loop that uses it.

Inspect runs an eval's lifecycle hooks and samples on one event loop, but a process may run
several evals one after another (each ``inspect_ai.eval`` call has its own loop), and several
tasks share one fleet. So the fleet is opened by the first ``task_init`` and let go by the last
``task_cleanup``, and a ``Dispatcher``, which belongs to the loop it was started on, is made
for each loop on first use and closed by the cleanup that runs on that loop. While the fleet is
open, this process is the owner of its samples' workspaces (``owners``).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading

import anyio

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet, load_fleet
from api.conversation.placement import fleet_started, place
from api.inspect_sandbox.owners import EvalOwner
from api.settings import OrchestratorSettings
from worker.contract.operations import EXEC, PUT_FILES, READ_FILE, REMOVE_WORKSPACE

#: What the sandbox environment calls on the workers.
SERVICE_OPERATIONS = tuple(
    operation.name for operation in (PUT_FILES, READ_FILE, REMOVE_WORKSPACE, EXEC)
)


class FleetLink:
    """The fleet, opened once however many tasks use it, and one dispatcher per event loop."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._stack: contextlib.ExitStack | None = None
        self._settings: OrchestratorSettings | None = None
        self._fleet: Fleet | None = None
        self._owner: EvalOwner | None = None
        self._dispatchers: dict[asyncio.AbstractEventLoop, Dispatcher] = {}

    @property
    def settings(self) -> OrchestratorSettings:
        """The settings of the fleet in use (the local stack's broker when one was started)."""
        if self._settings is None:
            raise RuntimeError(
                "the toolq sandbox is not open: Inspect calls task_init before any sample; "
                "outside an eval, call ToolqSandboxEnvironment.task_init first"
            )
        return self._settings

    @property
    def fleet(self) -> Fleet:
        assert self._fleet is not None, "settings is checked first"
        return self._fleet

    @property
    def owner(self) -> str:
        """The id of this process as the owner of its samples' workspaces (see ``owners``)."""
        assert self._owner is not None, "settings is checked first"
        return self._owner.id

    async def open(self) -> None:
        """Reach the fleet (starting a local stack when no broker is set) for one more user."""
        await anyio.to_thread.run_sync(self._open)

    async def close(self) -> None:
        """One user fewer: close this loop's dispatcher; the last user stops any local stack."""
        dispatcher = self._dispatchers.pop(_running_loop(), None)
        if dispatcher is not None:
            await dispatcher.close()
        await anyio.to_thread.run_sync(self._close)

    async def dispatcher(self) -> Dispatcher:
        """The dispatcher of the running event loop, started on first use."""
        loop = _running_loop()
        settings = self.settings
        for ended in [known for known in self._dispatchers if known.is_closed()]:
            # Its loop ended without a task_cleanup on it: its reply reader and connections
            # went with the loop, and nothing can be awaited on them any more.
            del self._dispatchers[ended]
        dispatcher = self._dispatchers.get(loop)
        if dispatcher is None:
            dispatcher = self._dispatchers[loop] = Dispatcher(settings)
            await dispatcher.start()
        return dispatcher

    def _open(self) -> None:
        with self._lock:
            if self._users == 0:
                settings = OrchestratorSettings()
                stack = contextlib.ExitStack()
                try:
                    settings = stack.enter_context(fleet_started(settings, place(settings)))
                    fleet = load_fleet(settings.redis_url).require_tools()
                    _require_service_operations(fleet)
                    owner = EvalOwner(settings.redis_url)
                    owner.start()
                    stack.callback(owner.stop)  # before the fleet, which may be a local stack
                except BaseException:
                    stack.close()
                    raise
                self._stack, self._settings, self._fleet = stack, settings, fleet
                self._owner = owner
            self._users += 1

    def _close(self) -> None:
        with self._lock:
            if self._users == 0:
                return
            self._users -= 1
            if self._users == 0 and self._stack is not None:
                stack, self._stack, self._settings, self._fleet = self._stack, None, None, None
                self._owner = None
                stack.close()


def _running_loop() -> asyncio.AbstractEventLoop:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError(
            "the toolq sandbox runs on asyncio, and Inspect is running on another async "
            "backend (trio?); run the eval with asyncio"
        ) from None


def _require_service_operations(fleet: Fleet) -> None:
    missing = [name for name in SERVICE_OPERATIONS if not fleet.serves(name)]
    if missing:
        raise RuntimeError(
            f"the toolq fleet does not serve {', '.join(missing)}: the sandbox needs a worker "
            "of each pool (tools and sandbox) of a toolq version that has them"
        )


#: The one link of this process: every task of every eval run here shares its fleet.
LINK = FleetLink()
