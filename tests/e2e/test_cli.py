"""The toolq commands, run as a user runs them."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from api.local.stack import worker_environment
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from tests.conftest import AgentsWorker, WorkerFleet
from tests.e2e.commands import clean_env, toolq

pytestmark = pytest.mark.e2e


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

    # Each sandbox worker's limits, and what enforces them.
    assert "sandbox worker" in status.stdout
    assert "256 by" in status.stdout
    assert "1,024 MiB by accounting" in status.stdout
    # Whether it keeps runs apart: a uid per run where the worker is root.
    assert ("yes: a uid per run" if os.geteuid() == 0 else "no: runs share") in status.stdout


def test_tools_and_status_through_a_pipe_cut_no_name_and_speak_json(
    fleet: WorkerFleet, model: ScriptedServer, agents_workers: Callable[..., AgentsWorker]
) -> None:
    agents_workers(fleet.settings, model.base_url)
    # As `toolq tools | grep ...` runs it: no terminal, and no COLUMNS to say how wide.
    env = {k: v for k, v in clean_env().items() if k != "COLUMNS"}
    env |= worker_environment(fleet.settings)

    table = toolq("tools", env=env)
    tools = toolq("tools", "--json", env=env)
    status = toolq("status", "--json", env=env)

    assert table.returncode == 0, table.stderr
    weather = next(line for line in table.stdout.splitlines() if "get_current_weather" in line)
    assert [cell.strip() for cell in weather.strip("│ ").split("│")] == [
        "get_current_weather",
        "tools",
        "yes",
        "1",
        "re-run if interrupted",
    ]
    listed = json.loads(tools.stdout)
    assert tools.returncode == 0, tools.stderr
    names = [tool["name"] for tool in listed["tools"]]
    assert "get_current_weather" in names and "run_bash" in names
    assert "toolq.exec" not in names  # the service operations are no tool of the model's
    for name in names:
        assert f"│ {name} " in table.stdout
    run_bash = next(tool for tool in listed["tools"] if tool["name"] == "run_bash")
    assert run_bash["pool"] == "sandbox" and run_bash["live_workers"] >= 1
    assert not run_bash["enabled_by_default"]
    assert listed["unavailable"] == []

    assert status.returncode == 0, status.stderr
    described = json.loads(status.stdout)
    assert described["pools"]["tools"]["queued"] == 0
    assert described["pools"]["sandbox"]["live_workers"] >= 1
    assert described["agents"] == {"queued": 0, "live_workers": 1, "conversations_running": 0}
    assert described["calls_in_flight"] == 0
    limits = described["sandbox_workers"][0]["limits"]
    assert limits["workspace_quota_by"] == "accounting"
    assert limits["sandbox"]["max_processes"] == 256


def test_status_without_a_broker_is_an_error_line() -> None:
    done = toolq("status", "--json", env=clean_env())

    assert done.returncode == 1
    assert done.stdout == ""
    assert done.stderr == (
        "error: no broker configured (TOOLQ_BROKER_URL): nothing is running to report on\n"
    )


def test_prune_removes_idle_workspaces_and_a_dry_run_only_lists(tmp_path: Path) -> None:
    for name, age in (("run-old", 3 * 86_400), ("run-new", 60)):
        (tmp_path / name).mkdir()
        os.utime(tmp_path / name, (time.time() - age, time.time() - age))
    env = clean_env() | {"TOOLQ_WORKSPACE_ROOT": str(tmp_path)}

    dry = toolq("prune", "--older-than", "2d", "--dry-run", env=env)
    kept = sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith("."))
    done = toolq("prune", "--older-than", "2d", env=env)
    bad = toolq("prune", "--older-than", "soon", env=env)

    assert dry.returncode == 0, dry.stderr
    assert "would remove 1 of 1" in dry.stdout
    assert kept == ["run-new", "run-old"]
    assert "removed 1 of 1" in done.stdout
    assert not (tmp_path / "run-old").exists() and (tmp_path / "run-new").exists()
    assert bad.returncode == 2
    assert "'soon' is not a duration" in bad.stderr


def test_prune_on_a_workspace_root_not_made_yet_says_so(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    env = clean_env() | {"TOOLQ_WORKSPACE_ROOT": str(root)}

    done = toolq("prune", env=env)

    assert done.returncode == 0, done.stderr
    assert done.stdout == f"No workspace to remove: {root} does not exist yet.\n"
    assert done.stderr == ""


def test_bad_settings_and_options_are_clear_errors() -> None:
    bad = toolq("tools", env=clean_env() | {"TOOLQ_MAX_TIMEOUT_MS": "soon"})
    assert bad.returncode == 2
    assert bad.stderr == (
        "error: TOOLQ_MAX_TIMEOUT_MS: Input should be a valid integer, unable to parse string "
        "as an integer\n"
    )
    pool = toolq("worker", "--pool", "gpu", env=clean_env())
    assert pool.returncode != 0
    assert "tools" in pool.stderr
    assert "agents" in pool.stderr
    keyless = toolq("worker", "--pool", "agents", env=clean_env())
    assert keyless.returncode == 2
    assert "an agents worker asks the model: OPENAI_API_KEY is not set" in keyless.stderr
