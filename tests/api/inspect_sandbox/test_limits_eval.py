"""A sample's own limits hold for Inspect's exec() (and so its bash() tool), not only for
run_bash: an eval whose sandbox configuration limits memory to 64 MB cannot hold 200 MB, where
the same eval without limits can."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.tool import bash

from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, run_eval, tool_messages
from tests.conftest import WorkerFleet
from tests.worker.test_run_limits import ALLOCATE_200_MB

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]

SCRIPTS = {"allocate": [("bash", {"command": ALLOCATE_200_MB})]}


def bash_output(log_dir: Path, sandbox: str | tuple[str, str]) -> str:
    log = run_eval([Sample(input="allocate", target="x")], log_dir, [bash()], SCRIPTS, sandbox)
    assert log.samples is not None
    [sample] = log.samples
    [answer] = tool_messages(sample)
    return answer.text


def test_a_sample_limited_to_64_mb_cannot_hold_200_mb(
    fleet_env: WorkerFleet, tmp_path: Path
) -> None:
    config = tmp_path / "toolq.yaml"
    config.write_text("limits:\n  memory_mb: 64\n")
    limited = bash_output(tmp_path / "limited", ("toolq", str(config)))
    unlimited = bash_output(tmp_path / "unlimited", "toolq")
    assert "held" in unlimited
    assert "held" not in limited
    assert "MemoryError" in limited or "Killed" in limited or "killed" in limited, limited
