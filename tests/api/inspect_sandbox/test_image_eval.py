"""An Inspect eval with ``sandbox=("toolq", image)``: each sample runs in a container of the
image of its own, started before it and ended after it."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.event import InfoEvent
from inspect_ai.tool import bash

from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, Scripts, run_eval, tool_messages
from tests.conftest import WorkerFleet

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]

SCRIPTS: Scripts = {
    "where": [("bash", {"command": "cat /etc/os-release; pwd; echo 45 > answer.txt"})],
}


def test_an_eval_runs_each_sample_in_a_container_of_the_image(
    image_env: tuple[WorkerFleet, str], tmp_path: Path
) -> None:
    workers, image = image_env
    samples = [Sample(input="where", target="45", id=f"where-{n}") for n in range(2)]
    log = run_eval(samples, tmp_path, [bash(timeout=10)], SCRIPTS, ("toolq", image))
    assert log.samples is not None and len(log.samples) == 2
    for sample in log.samples:
        [answer] = tool_messages(sample)
        assert 'NAME="toolq-full"' in answer.text and "/workspace" in answer.text
        assert sample.scores is not None and sample.scores["answer_file"].value == "C"
        started = [
            e.data
            for e in sample.events
            if isinstance(e, InfoEvent) and isinstance(e.data, dict) and "digest" in e.data
        ]
        assert started and str(started[0]["digest"]).startswith("sha256:")
    boxes = Path(workers.settings.image_cache) / "boxes"
    assert [p for p in boxes.iterdir() if p.is_dir()] == []
