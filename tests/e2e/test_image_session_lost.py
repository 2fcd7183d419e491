"""A session in a run's container does not outlive the worker that holds it: once that worker
dies (SIGKILL, as a crash), the session's shell and all it started are gone, and the run's next
session call answers "session lost" (not "environment lost", nor a silent new shell)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from api.calls.dispatch import Dispatcher
from api.runs.workspace import SESSION_TOOL, RunWorkspace, call_operation
from tests.conftest import WorkerFleet, wait_for
from tests.e2e.test_image_pinning import (  # noqa: F401 (fixtures)
    built,
    dispatcher,
    image_fleet,
    kill_sandbox_worker,
    new_run,
)
from tests.worker.images.builders import Images
from tests.worker.sessions.helpers import WAIT_MS, processes_with, token
from worker.contract.wire import ToolCallResult

pytestmark = pytest.mark.e2e


async def session_call(workspace: RunWorkspace, arguments: dict[str, Any]) -> ToolCallResult:
    spec = workspace._fleet.tools[SESSION_TOOL]
    return await call_operation(
        workspace._dispatcher,
        spec,
        workspace.run_id,
        {"timeout": WAIT_MS, **arguments},
        pool=spec.pool,
    )


async def test_a_session_in_a_container_whose_worker_died_answers_session_lost(
    image_fleet: WorkerFleet,  # noqa: F811
    dispatcher: Dispatcher,  # noqa: F811
    built: tuple[Path, Images],  # noqa: F811
) -> None:
    _, images = built
    workspace, environment = new_run(image_fleet, dispatcher, images.alpha)
    await environment.start()
    mark = token()
    started = await session_call(
        workspace, {"action": "type_submit", "input": f"export KEPT=1; sleep {mark} &"}
    )
    assert not started.is_error, started.output
    assert processes_with(f"sleep {mark}")

    kill_sandbox_worker(image_fleet)
    wait_for(lambda: not processes_with(f"sleep {mark}"), 30, "the session's job to end")

    lost = await session_call(workspace, {"action": "type_submit", "input": "echo $KEPT"})
    assert lost.is_error and lost.error_kind == "session_lost", lost.output
    assert "session lost" in lost.output and "restart" in lost.output
    await environment.end()
