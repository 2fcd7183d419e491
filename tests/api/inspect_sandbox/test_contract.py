"""Inspect's sandbox contract in terms of the fleet's answers, without a fleet: results, errors,
and what the environment refuses before it calls anything."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, cast

import pytest
from inspect_ai.util import (
    OutputLimitExceededError,
    SandboxUnavailableError,
    SandboxUserUnsupportedError,
)
from inspect_ai.util._sandbox.events import SandboxTimeoutError
from inspect_ai.util._sandbox.limits import override_max_read_file_size

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.exceptions import FileProblemError, ServiceCallError, ToolqSandboxError
from api.inspect_sandbox import ToolqSandboxEnvironment
from api.inspect_sandbox.contract import call_error, exec_outcome, file_error
from api.inspect_sandbox.owners import new_run_id, owner_of
from api.runs.workspace import CommandResult, RunWorkspace
from api.settings import OrchestratorSettings
from worker.contract.wire import RUN_ID_PATTERN


def command(**fields: Any) -> CommandResult:
    values: dict[str, Any] = {
        "stdout": "out",
        "stderr": "",
        "exit_code": 0,
        "timed_out": False,
        "duration_ms": 5,
    }
    return CommandResult.model_validate(values | fields)


def test_a_finished_command_is_its_result() -> None:
    result = exec_outcome(command(exit_code=3, stderr="why"), ["false"], 10)
    assert not result.success and result.returncode == 3
    assert (result.stdout, result.stderr) == ("out", "why")


def test_a_command_stopped_at_its_deadline_is_a_timeout_with_what_it_printed() -> None:
    with pytest.raises(SandboxTimeoutError, match="after 2 seconds") as caught:
        exec_outcome(command(timed_out=True, exit_code=-1, stdout="started\n"), ["sleep"], 2)
    assert isinstance(caught.value, TimeoutError)
    assert caught.value.truncated_output is not None
    assert caught.value.truncated_output.startswith("started\n")


def test_output_cut_at_the_cap_is_inspects_output_limit() -> None:
    cut = command(stdout="xxx\n[output truncated]", truncated={"stdout": True})
    with pytest.raises(OutputLimitExceededError, match="limit of 10 MiB was exceeded") as caught:
        exec_outcome(cut, ["yes"], 10)
    assert caught.value.truncated_output == "xxx\n[output truncated]"


def test_a_program_that_cannot_be_run_is_a_permission_error_but_a_scripts_own_is_not() -> None:
    refused = command(exit_code=126, stderr="sh: 1: /etc/passwd: Permission denied\n")
    with pytest.raises(PermissionError) as caught:
        exec_outcome(refused, ["/etc/passwd"], 10)
    assert caught.value.filename == "/etc/passwd"
    own = command(exit_code=126, stderr="bash: ./run.sh: Permission denied\n")
    assert exec_outcome(own, ["bash", "-c", "./run.sh"], 10).returncode == 126


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("not_found", FileNotFoundError),
        ("is_a_directory", IsADirectoryError),
        ("too_large", OutputLimitExceededError),
        ("not_a_regular_file", OSError),
        ("refused", PermissionError),
    ],
)
def test_file_problems_are_the_errors_inspect_documents(kind: Any, expected: type) -> None:
    error = file_error(FileProblemError(kind, "the worker's words"), "some/file.txt")
    assert isinstance(error, expected)
    if isinstance(error, OSError):
        assert error.filename == "some/file.txt"


def test_a_read_too_large_names_inspects_limit_in_force() -> None:
    with override_max_read_file_size(1024):
        error = file_error(FileProblemError("too_large", "big"), "big.bin")
    assert "limit of 1 KiB was exceeded" in str(error)


@pytest.mark.parametrize(
    ("kind", "expected"),
    [
        ("timeout", TimeoutError),
        ("no_answer", SandboxUnavailableError),
        ("broker_unavailable", SandboxUnavailableError),
        ("interrupted", SandboxUnavailableError),
        ("tool_error", ToolqSandboxError),
        ("invalid_arguments", ToolqSandboxError),
    ],
)
def test_failed_calls_are_timeouts_unavailability_or_refusals(kind: Any, expected: type) -> None:
    error = call_error(ServiceCallError("Error: what happened", kind), "writing 'x'")
    assert isinstance(error, expected)
    assert "what happened" in str(error) and "writing 'x'" in str(error)


def unconnected(max_timeout_ms: int = 600_000) -> ToolqSandboxEnvironment:
    """An environment whose fleet is never reached: for what it refuses before any call."""
    settings = OrchestratorSettings(
        broker_url="redis://127.0.0.1:1/0", max_timeout_ms=max_timeout_ms
    )
    workspace = RunWorkspace(cast(Dispatcher, None), Fleet(tools={}), "run-1")
    return ToolqSandboxEnvironment(workspace, settings)


async def test_another_user_is_refused_as_inspect_expects() -> None:
    with pytest.raises(SandboxUserUnsupportedError, match="sandbox user"):
        await unconnected().exec(["whoami"], user="root")


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ("compose.yaml", "configuration file compose.yaml does not exist"),
        ("Dockerfile", "not an image reference"),
        (42, "does not take 42"),
    ],
)
async def test_a_configuration_that_names_no_image_is_refused_saying_why(
    config: object, why: str
) -> None:
    with pytest.raises(ValueError, match=why):
        await ToolqSandboxEnvironment.task_init("task", config)  # type: ignore[arg-type]


async def test_a_compose_file_is_refused_saying_what_toolq_takes(tmp_path: Path) -> None:
    compose = tmp_path / "compose.yaml"
    compose.write_text("services:\n  default:\n    image: python:3.12-slim\n")
    with pytest.raises(ValueError, match="takes an image instead"):
        await ToolqSandboxEnvironment.task_init("task", str(compose))


def test_commands_are_bounded_by_the_fleets_longest_deadline() -> None:
    environment = unconnected(max_timeout_ms=20_000)
    assert environment._command_deadline_ms(5) == 5_000
    assert environment._command_deadline_ms(None) == 19_000
    assert environment._command_deadline_ms(3600) == 19_000


@pytest.mark.parametrize(
    "task", ["my_task", "a task/with: odd names!", "", "é" * 300, "ends-in-0123abcd"]
)
def test_run_ids_name_the_task_and_its_eval_and_fit_the_wire_contract(task: str) -> None:
    run_id = new_run_id(task, "e0e0e0e0")
    assert re.fullmatch(RUN_ID_PATTERN, run_id), run_id
    assert run_id.startswith("inspect-") and new_run_id(task, "e0e0e0e0") != run_id
    assert owner_of(run_id) == "e0e0e0e0"
    assert owner_of(f"mcp-{run_id}") is None and owner_of("inspect-x-0123abcd") is None
