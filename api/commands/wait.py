"""``toolq wait``: until the fleet's broker answers and live workers serve the tools named, for a
bounded time; a script that starts workers in the background goes on when they serve, or stops
with one line when they cannot (a worker it started has exited) or did not in time.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from api.calls.fleet import Fleet, load_fleet
from api.exceptions import FleetUnreachableError
from api.process.connections import check_connections
from api.settings import OrchestratorSettings
from worker.plumbing.proc_stat import process_alive

#: Ready.
EXIT_READY = 0
#: Not ready in time, or a worker the command watched stopped: the fleet is not there.
EXIT_NOT_READY = 1
#: Nothing to wait for: no broker is configured.
EXIT_NO_BROKER = 2
#: How long one look at the broker may take, and the pause between looks.
LOOK_TIMEOUT_S = 1.0
PAUSE_S = 0.25


@dataclass(frozen=True)
class Waited:
    """The end of a wait: its exit status, and the line that says so."""

    status: int
    line: str


def wait_for_fleet(
    settings: OrchestratorSettings,
    tools: Sequence[str],
    *,
    timeout_s: float,
    pids: Sequence[int] = (),
    clock: Callable[[], float] = time.monotonic,
) -> Waited:
    """Look at the fleet until the broker answers and each of ``tools`` has a live worker, at
    most ``timeout_s``; stop at once when a process of ``pids`` (workers started in the
    background) has ended, as it will not serve."""
    if settings.local_mode:
        return Waited(
            EXIT_NO_BROKER,
            "error: no broker configured (TOOLQ_BROKER_URL): there is no fleet to wait for",
        )
    deadline = clock() + timeout_s
    missing: list[str] = list(tools)
    unreachable: str | None = None
    while True:
        ended = [pid for pid in pids if not process_alive(pid)]
        if ended:
            return Waited(
                EXIT_NOT_READY,
                f"error: the worker of pid {ended[0]} stopped before the fleet was ready; the "
                "error it printed says why",
            )
        try:
            check_connections(settings, LOOK_TIMEOUT_S)
        except FleetUnreachableError as exc:
            unreachable = str(exc)
        else:
            unreachable = None
            missing = [tool for tool in tools if not _served(load_fleet(settings.redis_url), tool)]
            if not missing:
                served = f": {', '.join(tools)} served" if tools else ""
                return Waited(EXIT_READY, f"the fleet is ready{served}")
        if clock() >= deadline:
            break
        time.sleep(PAUSE_S)
    if unreachable is not None:
        return Waited(EXIT_NOT_READY, f"error: after {timeout_s:g} s, {unreachable}")
    return Waited(
        EXIT_NOT_READY,
        f"error: after {timeout_s:g} s no live worker serves {', '.join(missing)}; start one "
        "(toolq worker --pool POOL) and see what it printed",
    )


def _served(fleet: Fleet, tool: str) -> bool:
    spec = fleet.tools.get(tool)
    return spec is not None and bool(fleet.workers.get(spec.pool))
