"""Real Inspect evals with ``sandbox="toolq"`` on real workers: a scripted model (Inspect's
mockllm) calls Inspect's own bash(), python() and text_editor() tools, and the eval log shows what
ran where."""

from __future__ import annotations

import re
from dataclasses import dataclass

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.log import EvalLog, EvalSample
from inspect_ai.scorer import CORRECT
from inspect_ai.tool import bash, python, text_editor

from tests.api.inspect_sandbox.evals import (
    INSPECT_WARNINGS,
    Scripts,
    read_text,
    run_eval,
    tool_messages,
    workers_that_ran,
)
from tests.conftest import WorkerFleet
from tests.reliability.conftest import alive
from worker.contract.uid_range import UidRange

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]

#: Each sample's script: the tool calls the model makes, one per turn, then its answer.
SCRIPTS: Scripts = {
    "shell": [
        ("bash", {"command": "id -u; pwd; wc -l < data/in.txt; cat made-by-setup.txt"}),
        ("python", {"code": "total = sum(range(10))\nopen('answer.txt', 'w').write(str(total))"}),
        ("bash", {"command": "cat answer.txt"}),
    ],
    "hang": [("bash", {"command": "echo started; sleep 60"})],
    "flood": [
        ("bash", {"command": "head -c 100000000 /dev/zero | tr '\\0' x"}),
        ("bash", {"command": "echo still here > answer.txt; cat answer.txt"}),
    ],
    "missing": [("read_text", {"path": "no/such/file.txt"})],
    "editor": [
        ("text_editor", {"command": "create", "path": "answer.txt", "file_text": "edited\n"}),
        ("text_editor", {"command": "view", "path": "answer.txt"}),
    ],
}


@dataclass(frozen=True)
class Evaluated:
    log: EvalLog
    #: The sandbox pool's worker processes before the eval.
    sandbox_pids: set[int]


@pytest.fixture(scope="module")
def evaluated(fleet_env: WorkerFleet, tmp_path_factory: pytest.TempPathFactory) -> Evaluated:
    samples = [
        Sample(
            input="shell",
            target="45",
            id="shell",
            files={"data/in.txt": "three\nlines\nhere\n"},
            setup="#!/bin/sh\necho from the setup script > made-by-setup.txt\n",
        ),
        Sample(input="hang", target="", id="hang"),
        Sample(input="flood", target="still here", id="flood"),
        Sample(input="missing", target="", id="missing"),
        Sample(input="editor", target="edited", id="editor"),
    ]
    log_dir = tmp_path_factory.mktemp("inspect-logs")
    before = set(fleet_env.worker_pids("sandbox"))
    tools = [bash(timeout=5), python(timeout=5), text_editor(), read_text()]
    return Evaluated(run_eval(samples, log_dir, tools, SCRIPTS), before)


def sample_of(evaluated: Evaluated, sample_id: str) -> EvalSample:
    assert evaluated.log.samples is not None
    return next(sample for sample in evaluated.log.samples if sample.id == sample_id)


def test_commands_run_in_the_samples_workspace_on_the_sandbox_workers(
    evaluated: Evaluated, fleet_env: WorkerFleet
) -> None:
    shell = sample_of(evaluated, "shell")
    first, second, third = tool_messages(shell)
    user, workspace, lines, setup = first.text.strip().splitlines()
    # The sample's own uid, one of the fleet's range: this test runs as root.
    assert int(user) in UidRange.parse(fleet_env.settings.sandbox.uid_range)
    root = str(fleet_env.settings.workspace_root.resolve())
    assert re.fullmatch(rf"{re.escape(root)}/inspect-[\w.-]+", workspace), workspace
    assert lines == "3"  # the sample's files were put in its workspace
    assert setup == "from the setup script"  # and its setup script ran there
    assert second.error is None and third.text.strip() == "45"
    assert shell.scores is not None and shell.scores["answer_file"].value == CORRECT
    # The pool's processes before the eval and now: one may have been replaced meanwhile.
    pool = evaluated.sandbox_pids | set(fleet_env.worker_pids("sandbox"))
    sandbox_pids = {str(pid) for pid in pool}
    ran_on = workers_that_ran(shell)
    assert len(ran_on) >= 4  # setup and the three calls, at least
    assert {worker.rsplit(":", 1)[1] for worker in ran_on} <= sandbox_pids


def test_a_command_past_its_timeout_is_a_timeout_for_the_model(evaluated: Evaluated) -> None:
    [hung] = tool_messages(sample_of(evaluated, "hang"))
    assert hung.error is not None and hung.error.type == "timeout"
    assert "started" in hung.text  # what it printed before it was stopped


def test_output_past_inspects_limit_is_an_output_limit_and_the_worker_goes_on(
    evaluated: Evaluated, fleet_env: WorkerFleet
) -> None:
    flood = sample_of(evaluated, "flood")
    flooded, after = tool_messages(flood)
    assert flooded.error is not None and flooded.error.type == "limit"
    assert "10 MiB" in flooded.error.message  # Inspect's limit on a command's output
    assert after.error is None and after.text.strip() == "still here"
    assert flood.scores is not None and flood.scores["answer_file"].value == CORRECT
    # The worker processes that took the flood were the pool's from the start and live on: the
    # flood cost none of them. (Whatever else the pool did meanwhile is not this test's.)
    flooded_on = {int(worker.rsplit(":", 1)[1]) for worker in workers_that_ran(flood)}
    assert flooded_on and flooded_on <= evaluated.sandbox_pids
    assert all(alive(pid) for pid in flooded_on), flooded_on


def test_a_missing_file_is_file_not_found(evaluated: Evaluated) -> None:
    [read] = tool_messages(sample_of(evaluated, "missing"))
    assert read.error is not None and read.error.type == "file_not_found"
    assert "no/such/file.txt" in read.error.message


def test_text_editor_works_in_the_workspace(evaluated: Evaluated) -> None:
    editor = sample_of(evaluated, "editor")
    created, viewed = tool_messages(editor)
    assert created.error is None and "answer.txt" in created.text
    assert viewed.error is None and "1\tedited" in viewed.text
    assert editor.scores is not None and editor.scores["answer_file"].value == CORRECT


def test_every_samples_workspace_is_removed_after_it(
    evaluated: Evaluated, fleet_env: WorkerFleet
) -> None:
    assert evaluated.log.samples is not None and len(evaluated.log.samples) == 5
    assert evaluated.log.results is not None
    assert not list(fleet_env.settings.workspace_root.glob("inspect-*"))
