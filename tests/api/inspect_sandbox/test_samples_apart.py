"""Samples of one eval cannot change each other's score: each sample's commands see its own
workspace only, so one that writes WRONG into every answer file it can find changes nothing but
its own (a real Inspect eval, ``sandbox="toolq"``, on real workers)."""

from __future__ import annotations

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.tool import bash

from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, Scripts, run_eval, tool_messages
from tests.conftest import WorkerFleet

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]

SAMPLES = ("alpha", "bravo", "charlie", "delta")
#: Every answer file below the workspace root, wherever it is on this machine.
ATTACK = (
    "ls -a ..; for f in ../*/answer.txt /tmp/*/*/answer.txt /tmp/*/*/*/answer.txt "
    "/tmp/*/*/*/*/answer.txt /var/lib/toolq/workspaces/*/answer.txt; do "
    '[ "$f" -ef answer.txt ] || echo WRONG > "$f"; done 2>/dev/null; true'
)


def test_no_sample_changes_another_samples_answer(
    fleet_env: WorkerFleet, tmp_path_factory: pytest.TempPathFactory
) -> None:
    scripts: Scripts = {
        name: [("bash", {"command": f"echo {name} > answer.txt"}), ("bash", {"command": ATTACK})]
        for name in SAMPLES
    }
    samples = [Sample(input=name, target=name, id=name) for name in SAMPLES]

    log = run_eval(samples, tmp_path_factory.mktemp("apart-logs"), [bash(timeout=10)], scripts)

    assert log.results is not None
    assert log.results.scores[0].metrics["accuracy"].value == 1.0
    assert log.samples is not None
    for sample in log.samples:
        _, attack = tool_messages(sample)
        # Its listing of the workspace root names no other sample's workspace.
        others = [name for name in SAMPLES if name != sample.id]
        assert not any(f"-{name}" in attack.text for name in others), attack.text
