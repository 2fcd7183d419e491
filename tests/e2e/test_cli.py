"""The toolq commands, run as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api.local.stack import worker_environment
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from tests.conftest import AgentsWorker, WorkerFleet

pytestmark = pytest.mark.e2e
TOOLQ = str(Path(sys.executable).parent / "toolq")


def toolq(
    *args: str, env: dict[str, str], timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [TOOLQ, *args], env=env, capture_output=True, text=True, timeout=timeout, check=False
    )


def clean_env() -> dict[str, str]:
    """The user's environment without any toolq or OpenAI configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TOOLQ_", "OPENAI_"))} | {
        "COLUMNS": "200"
    }


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedServer]:
    script = Script.from_steps(
        [
            {
                "content": "Let me write that down.",
                "tool_calls": [
                    {
                        "name": "write_file",
                        "arguments": {"path": "todo.txt", "content": "{prompt}"},
                    },
                    {"name": "list_dir", "arguments": {}},
                ],
            },
            {"content": "Saved your note to todo.txt."},
        ]
    )
    with ScriptedServer(script) as server:
        yield server


def fleet_env(fleet: WorkerFleet, model: ScriptedServer) -> dict[str, str]:
    return (
        clean_env()
        | worker_environment(fleet.settings)
        | {
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": "test",
        }
    )


def test_demo_runs_on_a_fresh_local_stack() -> None:
    done = toolq("demo", env=clean_env())
    assert done.returncode == 0, done.stdout + done.stderr
    for tool in (
        "write_file",
        "read_file",
        "search_text",
        "search_files",
        "run_bash",
        "get_current_weather",
    ):
        assert f"✓ {tool} in" in done.stdout
    assert "6 tool calls (0 failed)" in done.stdout
    assert "Sunny" in done.stdout
    # The model client's connections are closed, not left for the garbage collector to report.
    assert "Unclosed" not in done.stdout + done.stderr


def test_run_prints_the_answer_and_the_transcript(
    fleet: WorkerFleet, model: ScriptedServer
) -> None:
    env = fleet_env(fleet, model)
    plain = toolq("run", "buy milk", "--model", "scripted", env=env)
    assert plain.returncode == 0, plain.stderr
    assert plain.stdout.strip() == "Saved your note to todo.txt."
    as_json = toolq("run", "buy bread", "--model", "scripted", "--json", env=env)
    transcript = json.loads(as_json.stdout)
    assert transcript["answer"] == "Saved your note to todo.txt."
    assert [c["name"] for c in transcript["tool_calls"]] == ["write_file", "list_dir"]
    assert all(c["worker"] and not c["is_error"] for c in transcript["tool_calls"])
    assert transcript["usage"]["total_tokens"] > 0
    workspace = Path(fleet.settings.workspace_root) / transcript["run_id"]
    assert (workspace / "todo.txt").read_text() == "buy bread"
    assert "Unclosed" not in plain.stderr + as_json.stderr


def test_run_streams_text_and_tool_activity(fleet: WorkerFleet, model: ScriptedServer) -> None:
    streamed = toolq(
        "run", "call mum", "--model", "scripted", "--stream", env=fleet_env(fleet, model)
    )
    assert streamed.returncode == 0, streamed.stderr
    out = streamed.stdout
    assert out.index("Let me write that down.") < out.index("→ write_file")
    assert "✓ list_dir in" in out
    assert out.rstrip().endswith("Saved your note to todo.txt.")


def test_run_without_a_model_api_says_what_to_set() -> None:
    done = toolq("run", "hello", env=clean_env())
    assert done.returncode == 2
    assert "OPENAI_API_KEY" in done.stderr
    assert "toolq demo" in done.stderr


def test_tools_and_status_describe_the_fleet(
    fleet: WorkerFleet, model: ScriptedServer, agents_workers: Callable[..., AgentsWorker]
) -> None:
    agents_workers(fleet.settings, model.base_url)
    env = clean_env() | worker_environment(fleet.settings)
    tools = toolq("tools", env=env)
    assert tools.returncode == 0, tools.stderr
    run_bash = next(line for line in tools.stdout.splitlines() if "run_bash" in line)
    assert "sandbox" in run_bash
    assert "no" in run_bash
    status = toolq("status", env=env)
    assert status.returncode == 0, status.stderr
    assert "tools" in status.stdout
    assert "sandbox" in status.stdout
    assert "calls in flight" in status.stdout
    # The agents pool next to the tool pools: nothing queued, one worker live.
    agents = next(line for line in status.stdout.splitlines() if "agents" in line)
    assert [cell.strip() for cell in agents.strip("│ ").split("│")] == ["agents", "0", "1"]
    assert "conversations running: 0" in status.stdout


def test_bad_settings_and_options_are_clear_errors() -> None:
    bad = toolq("tools", env=clean_env() | {"TOOLQ_MAX_TIMEOUT_MS": "soon"})
    assert bad.returncode == 2
    assert "max_timeout_ms" in bad.stderr
    pool = toolq("worker", "--pool", "gpu", env=clean_env())
    assert pool.returncode != 0
    assert "tools" in pool.stderr
    assert "agents" in pool.stderr
    keyless = toolq("worker", "--pool", "agents", env=clean_env())
    assert keyless.returncode == 2
    assert "an agents worker asks the model: OPENAI_API_KEY is not set" in keyless.stderr
