"""A sample's own limits come from its task's sandbox configuration (``limits``, as Inspect's
compose resources are per sample); a task asking above TOOLQ_LIMITS_MAX_* stops at task_init in
one line, before any sample runs."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import get_model
from inspect_ai.solver import generate

from api.inspect_sandbox.image_config import sandbox_config
from api.inspect_sandbox.link import LINK
from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, MODEL, scripted_model
from tests.conftest import WorkerFleet
from worker.contract.run_limits import RunLimits


def test_the_limits_are_read_from_the_tasks_configuration(tmp_path: Path) -> None:
    config = tmp_path / "toolq.yaml"
    config.write_text("limits:\n  memory_mb: 256\n  pids: 32\n")
    assert sandbox_config(str(config)).limits == RunLimits(memory_mb=256, pids=32)
    assert sandbox_config(None).limits is None
    config.write_text("limits: {memory: 256}\n")
    with pytest.raises(ValueError, match=r"limits\.memory") as refused:
        sandbox_config(str(config))
    assert "\n" not in str(refused.value)


@pytest.mark.integration
@INSPECT_WARNINGS
def test_a_task_asking_above_the_maximums_stops_before_any_sample(
    fleet_env: WorkerFleet, tmp_path: Path
) -> None:
    greedy = tmp_path / "toolq.yaml"
    greedy.write_text("limits:\n  memory_mb: 999999\n")
    task = Task(
        dataset=[Sample(input="hello", target="x")],
        solver=[generate()],
        sandbox=("toolq", str(greedy)),
    )
    model = get_model(MODEL, custom_outputs=scripted_model({"hello": []}))

    with pytest.raises(ValueError, match=r"memory_mb=999999 \(at most 4096\)") as refused:
        eval(task, model=model, log_dir=str(tmp_path / "logs"), display="none")

    assert "\n" not in str(refused.value)
    # The refused task let the fleet go: the process's next eval opens the fleet it names then.
    with pytest.raises(RuntimeError, match="not open"):
        _ = LINK.settings
