"""run_bash as the model uses it: output, exit codes, deadlines, caps, leftovers, bad input."""

from __future__ import annotations

import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import wait_for
from tests.worker.conftest import one_uid
from worker.sandbox import SandboxConfig, describe_isolation
from worker.tools.bash import RunBashArgs, RunBashTool
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

CAP = 51_200


@pytest.fixture
def sandbox_workspace(sandbox_dir: Path) -> Workspace:
    """A workspace the sandbox user may use."""
    return Workspace(sandbox_dir)


@pytest.fixture
def bash(sandbox_workspace: Workspace, mode: str) -> RunBashTool:
    return RunBashTool(sandbox_workspace, SandboxConfig(one_uid(isolation=mode)))


def run(tool: RunBashTool, command: str, **args: Any) -> dict[str, Any]:
    validated = RunBashArgs.model_validate({"command": command, **args}).model_dump()
    answer: dict[str, Any] = json.loads(tool.execute(validated))
    return answer


def sleep_token() -> str:
    """A unique duration for ``sleep`` (GNU sleep adds its arguments): it marks one process."""
    return f"0.{secrets.randbelow(10**9):09d}1"


def running_with(token: str) -> list[int]:
    """Live processes with ``token`` as an argument (a zombie has no command line left)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            argv = Path(f"/proc/{entry}/cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if token.encode() in argv:
            found.append(int(entry))
    return found


def test_reports_stdout_stderr_and_exit_code(bash: RunBashTool) -> None:
    started = time.monotonic()
    answer = run(bash, "echo hello; echo oops >&2; exit 3")
    waited_ms = (time.monotonic() - started) * 1000

    assert answer["stdout"] == "hello\n"
    assert answer["stderr"] == "oops\n"
    assert answer["exit_code"] == 3
    assert answer["timed_out"] is False
    assert answer["truncated"] == {"stdout": False, "stderr": False}
    assert answer["isolation"] == describe_isolation(bash._config)
    assert 0 < answer["duration_ms"] <= waited_ms  # milliseconds, of this call


def test_stdin_is_empty(bash: RunBashTool) -> None:
    answer = run(bash, "cat; echo done")

    assert answer["stdout"] == "done\n"


def test_runs_in_the_workspace_or_a_directory_inside_it(
    bash: RunBashTool, sandbox_workspace: Workspace
) -> None:
    (sandbox_workspace.root / "sub").mkdir()

    assert run(bash, "pwd; echo $HOME")["stdout"] == f"{sandbox_workspace.root}\n" * 2
    assert run(bash, "pwd", cwd="sub")["stdout"] == f"{sandbox_workspace.root / 'sub'}\n"


async def test_a_cwd_outside_the_workspace_is_refused(bash: RunBashTool) -> None:
    registry = ToolRegistry()
    registry.register(bash)

    escaping = await registry.run("run_bash", {"command": "pwd", "cwd": "../.."})
    missing = await registry.run("run_bash", {"command": "pwd", "cwd": "no-such-dir"})

    assert escaping.error_kind == "tool_error"
    assert "outside the workspace" in escaping.output
    assert missing.error_kind == "tool_error"
    assert "'no-such-dir' does not exist" in missing.output


def test_passes_env_and_hides_the_workers_secrets(
    bash: RunBashTool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXAMPLE_TEST_API_KEY", "sk-secret-4f1c9e")

    answer = run(
        bash,
        f"env; cat /proc/{os.getpid()}/environ",
        env={"GREETING": "hello there", "PATH": "/usr/bin:/bin"},
    )

    assert "GREETING=hello there\n" in answer["stdout"]
    assert "PATH=/usr/bin:/bin\n" in answer["stdout"]
    assert "LANG=C.UTF-8\n" in answer["stdout"]
    assert "EXAMPLE_TEST_API_KEY" not in answer["stdout"]
    if os.geteuid() == 0 or bash._config.settings.isolation == "namespaces":
        # As another user, or in a PID namespace, the worker's environment cannot be read.
        assert "sk-secret-4f1c9e" not in answer["stdout"]
        assert answer["exit_code"] != 0


def test_timeout_kills_everything_and_keeps_the_output_so_far(bash: RunBashTool) -> None:
    token = sleep_token()
    started = time.monotonic()

    answer = run(bash, f"echo start; sleep 30 {token} & sleep 30 {token}", timeout=300)

    assert time.monotonic() - started < 30  # cut at its limit, the sleeps not waited out
    assert answer["timed_out"] is True
    assert answer["exit_code"] == -1
    assert answer["stdout"] == "start\n"
    assert answer["stderr"].splitlines()[-1].startswith("[timed out after 300 ms")
    # Well before the sleeps would end by themselves.
    wait_for(lambda: not running_with(token), timeout=15, what="the timed-out command to be gone")


def test_background_processes_are_killed_and_the_call_returns_at_once(bash: RunBashTool) -> None:
    plain, detached, nohup = sleep_token(), sleep_token(), sleep_token()
    # They keep stdout and stderr open: the call must not wait for those pipes to close. The
    # shell ends only once the detached one has its own session (it touched `ready`).
    command = (
        f"sleep 300 {plain} & nohup sleep 300 {nohup} & "
        f"setsid sh -c 'touch ready; exec sleep 300 {detached}' & "
        "for i in $(seq 500); do [ -e ready ] && break; sleep 0.01; done; echo started"
    )
    answer = run(bash, command)

    # Waiting for their pipes would have run into the call's time limit.
    assert answer["timed_out"] is False
    assert answer["stdout"] == "started\n"
    assert answer["exit_code"] == 0
    tokens = (plain, detached, nohup)
    wait_for(
        lambda: not any(running_with(token) for token in tokens),
        timeout=30,
        what="leftovers to die",
    )


def test_a_command_killed_from_outside_is_reported(bash: RunBashTool) -> None:
    token = sleep_token()
    answers: list[dict[str, Any]] = []
    call = threading.Thread(target=lambda: answers.append(run(bash, f"exec sleep 30 {token}")))
    call.start()
    try:
        wait_for(lambda: bool(running_with(token)), timeout=10, what="the command to start")
        for pid in running_with(token):
            os.kill(pid, 9)  # what the OOM killer does
    finally:
        call.join(timeout=10)

    assert answers[0]["exit_code"] == 128 + 9
    assert answers[0]["timed_out"] is False
    assert "killed by SIGKILL" in answers[0]["stderr"]


def test_output_is_capped_while_read(bash: RunBashTool) -> None:
    answer = run(bash, "yes | head -c 10000000; echo tail >&2")

    assert answer["truncated"] == {"stdout": True, "stderr": False}
    shown, notice = answer["stdout"].rsplit("\n[", 1)
    assert shown == "y\n" * (CAP // 2)
    assert notice == "output truncated: showing the first 51,200 of 10,000,000 bytes]"
    assert answer["stderr"] == "tail\n"
    assert answer["exit_code"] == 0


def test_a_gigabyte_of_output_costs_no_more_memory_than_the_cap(bash: RunBashTool) -> None:
    Path("/proc/self/clear_refs").write_text("5")  # restarts the peak-RSS count (VmHWM)
    before = _peak_rss_kb()

    answer = run(bash, "head -c 1000000000 /dev/zero; echo finished >&2", timeout=20_000)

    assert answer["exit_code"] == 0
    assert answer["stderr"] == "finished\n"
    assert "of 1,000,000,000 bytes]" in answer["stdout"]
    assert _peak_rss_kb() - before < 64 * 1024


def _peak_rss_kb() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1])
    raise AssertionError("no VmHWM in /proc/self/status")


@pytest.mark.parametrize("char", ["é", "€", "🙂"])
def test_a_character_cut_by_the_cap_is_dropped_and_the_answer_stays_json(
    sandbox_workspace: Workspace, mode: str, char: str
) -> None:
    width = len(char.encode())
    tool = RunBashTool(
        sandbox_workspace,
        SandboxConfig(one_uid(isolation=mode), output_cap_bytes=10 * width + 1),
    )

    raw = tool.execute({"command": f"printf '{char * 20}'", "timeout": 5_000})

    answer = json.loads(raw)
    assert answer["stdout"].split("\n[")[0] == char * 10
    assert answer["truncated"]["stdout"] is True


def test_bytes_that_are_not_utf8_become_replacement_characters(bash: RunBashTool) -> None:
    answer = run(bash, r"printf 'ok \377\376 end'")

    assert answer["stdout"] == "ok \ufffd\ufffd end"


async def test_bad_arguments_are_refused_with_a_clear_message(bash: RunBashTool) -> None:
    registry = ToolRegistry()
    registry.register(bash)
    cases: list[tuple[dict[str, Any], str]] = [
        ({}, "'command': Field required"),
        ({"command": 42}, "'command': Input should be a valid string"),
        ({"command": ""}, "'command': String should have at least 1 character"),
        ({"command": "true", "timeout": 0}, "'timeout': Input should be greater than 0"),
        ({"command": "true", "timeout": 600_001}, "less than or equal to 600000"),
        ({"command": "true", "timeout": "soon"}, "'timeout': Input should be a valid integer"),
        ({"command": "true", "env": {"A": 1}}, "'env.A': Input should be a valid string"),
        ({"command": "true", "env": {"A=B": "c"}}, "not a valid variable name"),
        ({"command": "true", "shell": "zsh"}, "'shell': unknown parameter"),
    ]
    for arguments, message in cases:
        outcome = await registry.run("run_bash", arguments)

        assert outcome.error_kind == "invalid_arguments", arguments
        assert message in outcome.output, (arguments, outcome.output)


def test_the_tool_describes_itself_for_the_sandbox_pool(sandbox_workspace: Workspace) -> None:
    schema = RunBashTool(sandbox_workspace).get_schema()["function"]

    assert schema["parameters"]["required"] == ["command"]
    assert schema["parameters"]["properties"]["timeout"]["maximum"] == 600_000
    assert RunBashTool.pool == "sandbox"
    assert RunBashTool.enabled_by_default is False
    assert RunBashTool.caps_own_output is True


def test_the_schema_warns_that_commands_can_destroy_files_and_that_it_is_off_by_default(
    sandbox_workspace: Workspace,
) -> None:
    description = RunBashTool(sandbox_workspace).get_schema()["function"]["description"]
    assert "can change or destroy any file in the workspace" in description
    assert "Off unless enabled" in description
    assert RunBashTool.enabled_by_default is False
