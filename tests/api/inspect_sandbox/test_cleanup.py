"""``inspect sandbox cleanup toolq``: the workspaces an eval killed outright left are removed,
and none that a running eval owns."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from api.inspect_sandbox.environment import ToolqSandboxEnvironment
from tests.api.inspect_sandbox.conftest import fleet_variables
from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS
from tests.conftest import WorkerFleet, wait_for_file
from tests.e2e.commands import clean_env, run_command

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]

INSPECT = str(Path(sys.executable).parent / "inspect")

#: An eval whose one sample runs a command in its workspace, then hangs in its next model turn
#: (as an eval does that is killed mid-sample), having written the workspace's path to argv[1].
EVAL_KILLED_MID_SAMPLE = """
import sys, threading
from pathlib import Path
from inspect_ai import Task, eval
from inspect_ai.dataset import Sample
from inspect_ai.model import ModelOutput, ModelUsage, get_model
from inspect_ai.solver import generate, use_tools
from inspect_ai.tool import bash

MODEL = "mockllm/model"

def answer(messages, *_):
    if not any(message.role == "assistant" for message in messages):
        output = ModelOutput.for_tool_call(MODEL, "bash", {"command": "echo x > left.txt; pwd"})
        output.usage = ModelUsage(input_tokens=10, output_tokens=5, total_tokens=15)
        return output
    partial = Path(sys.argv[1] + ".partial")
    partial.write_text(messages[-1].text.strip())
    partial.rename(sys.argv[1])
    threading.Event().wait()

task = Task(dataset=[Sample(input="go")], solver=[use_tools([bash(timeout=30)]), generate()],
            sandbox="toolq")
eval(task, model=get_model(MODEL, custom_outputs=answer), log_dir=sys.argv[2], display="none")
"""


async def test_cleanup_removes_what_a_killed_eval_left_and_nothing_a_running_one_owns(
    fleet_env: WorkerFleet, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Evals on this machine say they run in its temporary folder: this test's own.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    env = clean_env() | fleet_variables(fleet_env) | {"TMPDIR": str(tmp_path)}
    ready, log = tmp_path / "workspace.txt", tmp_path / "eval.log"
    with log.open("wb") as output:
        killed = subprocess.Popen(
            [sys.executable, "-c", EVAL_KILLED_MID_SAMPLE, str(ready), str(tmp_path / "logs")],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        wait_for_file(ready, killed, log, "the eval's sample to run a command")
    finally:
        killed.kill()
        killed.wait(timeout=30)
    left = Path(ready.read_text())
    assert left.parent == fleet_env.settings.workspace_root.resolve()
    assert (left / "left.txt").read_text() == "x\n"

    # A running eval's sample: this process, with the sandbox open.
    await ToolqSandboxEnvironment.task_init("running", None)
    environments = await ToolqSandboxEnvironment.sample_init("running", None, {})
    try:
        running = environments["default"].as_type(ToolqSandboxEnvironment).workspace.run_id
        await environments["default"].write_file("mine.txt", "mine")
        owned = fleet_env.settings.workspace_root / running

        cleaned = run_command([INSPECT, "sandbox", "cleanup", "toolq"], env=env)
        assert cleaned.returncode == 0, cleaned.stderr
        assert f"removed {left.name}" in cleaned.stdout.splitlines()
        assert "toolq: removed 1 workspace(s)" in cleaned.stdout
        assert not left.exists()
        assert (owned / "mine.txt").read_text() == "mine"

        named = run_command([INSPECT, "sandbox", "cleanup", "toolq", running], env=env)
        assert named.returncode == 0, named.stderr
        assert f"removed {running}" in named.stdout.splitlines()
        assert not owned.exists()

        refused = run_command([INSPECT, "sandbox", "cleanup", "toolq", "mcp-123"], env=env)
        assert refused.returncode == 2
        assert "'mcp-123' is not the run id of a toolq sandbox" in refused.stderr
    finally:
        await ToolqSandboxEnvironment.sample_cleanup("running", None, environments, False)
        await ToolqSandboxEnvironment.task_cleanup("running", None, True)
