"""Tools for tests: slow calls to kill a worker under, a call that ignores its soft limit, a
call that waits for the test to open its gate, and tools made of plain functions (one described
by its signature, one by a JSON Schema)."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from worker.tools.context import ToolContext
from worker.tools.filesystem import WorkspaceTool
from worker.tools.functions import tool
from worker.tools.interface import ExecutableTool
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace


class SlowArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    seconds: float = 0.0
    marker: str = "marker"


class _Slow(WorkspaceTool):
    """Appends its pid to <marker>.runs in the workspace, then sleeps."""

    Args = SlowArgs

    def execute(self, args: dict[str, Any]) -> str:
        runs = Path(self.workspace.root) / f"{args['marker']}.runs"
        with runs.open("a") as f:
            f.write(f"{os.getpid()}\n")
        time.sleep(args["seconds"])
        return f"slept {args['seconds']}s"


class SlowReadTool(_Slow):
    name = "slow_read"
    description = "Sleeps, then answers; safe to repeat."
    idempotent = True


class SlowWriteTool(_Slow):
    name = "slow_write"
    description = "Sleeps, then answers; has effects."
    idempotent = False


class StubbornTool(ExecutableTool):
    name = "stubborn"
    description = "Ignores its soft time limit."
    default_timeout_ms = 500

    def execute(self, args: dict[str, Any]) -> str:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            # Swallowing the soft limit is the point: only the hard limit can stop this.
            with contextlib.suppress(BaseException):
                time.sleep(0.05)
        return "never"


class RendezvousArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    name: str
    count: int = 2


class RendezvousTool(WorkspaceTool):
    """Succeeds only if ``count`` calls with the same name run at the same time."""

    name = "rendezvous"
    description = "Waits for its peers."
    Args = RendezvousArgs

    def execute(self, args: dict[str, Any]) -> str:
        root = Path(self.workspace.root)
        (root / f"{args['name']}.{os.getpid()}.{time.monotonic_ns()}").touch()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if len(list(root.glob(f"{args['name']}.*"))) >= args["count"]:
                return "met"
            time.sleep(0.01)
        raise RuntimeError("nobody came: the calls did not run at the same time")


class GateArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")
    path: str


class GateTool(ExecutableTool):
    """Waits until the file at ``path`` exists: a test opens the gate once it is ready for what
    follows the call."""

    name = "gate"
    description = "Waits until its gate is opened."
    Args = GateArgs
    default_timeout_ms = 300_000

    def execute(self, args: dict[str, Any]) -> str:
        gate = Path(args["path"])
        deadline = time.monotonic() + 280
        while not gate.exists():
            if time.monotonic() > deadline:
                raise RuntimeError(f"the gate {gate} was never opened")
            time.sleep(0.02)
        return "opened"


class NoopTool(ExecutableTool):
    name = "noop"
    description = "Does nothing."
    idempotent = True

    def execute(self, args: dict[str, Any]) -> str:
        return "ok"


class BadReturnTool(ExecutableTool):
    name = "bad_return"
    description = "Returns a value JSON cannot hold."

    def execute(self, args: dict[str, Any]) -> object:
        return object()


@tool(idempotent=True)
def repeat(word: str, times: int = 2) -> str:
    """Repeats a word.

    Args:
        word: The word to repeat.
        times: How many times.
    """
    return " ".join([word] * times)


@tool
def explode(payload: str) -> str:
    """Raises, whatever it is given.

    Args:
        payload: Text that must never reach a log.
    """
    raise RuntimeError("disk on fire")


def _area(width: float, height: float) -> dict[str, float]:
    return {"area": width * height}


AREA_PARAMETERS = {
    "type": "object",
    "properties": {
        "width": {"type": "number", "minimum": 0},
        "height": {"type": "number", "minimum": 0},
    },
    "required": ["width", "height"],
    "additionalProperties": False,
}


def register(registry: ToolRegistry, context: ToolContext, workspace: Workspace) -> None:
    for made in (
        SlowReadTool(workspace),
        SlowWriteTool(workspace),
        StubbornTool(),
        RendezvousTool(workspace),
        GateTool(),
        NoopTool(),
        BadReturnTool(),
        repeat,
        explode,
    ):
        registry.register(made)
    registry.register_function(
        _area, name="area", description="A rectangle's area.", parameters=AREA_PARAMETERS
    )
