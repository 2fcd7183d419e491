"""run_bash: a shell command in the workspace, run in the sandbox, answered as JSON."""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, field_validator

from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, cap_in_words
from worker.contract.run_limits import RunLimits
from worker.contract.settings import get_worker_settings
from worker.contract.variables import Variables
from worker.contract.wire import CommandAnswer, ResourceUsage, StreamsCut
from worker.exceptions import WorkspaceError
from worker.sandbox import SandboxConfig, SandboxResult
from worker.tools.commands import run_command
from worker.tools.interface import JsonAnswerTool, ToolArgs
from worker.tools.paths import shown
from worker.tools.runtime import admit_current_call, current_limits, report_usage
from worker.tools.workspace import Workspace

MAX_TIMEOUT_MS = 600_000
#: A command's time limit when the call gives none.
DEFAULT_TIMEOUT_MS = 30_000


class RunBashArgs(ToolArgs):
    """Arguments of run_bash."""

    command: str = Field(
        min_length=1, description="The command line, run by /bin/sh -c (POSIX shell syntax)."
    )
    cwd: str | None = Field(
        None, description="Directory to run in, relative to the workspace; default the workspace."
    )
    env: Variables | None = Field(
        None, description='Extra environment variables, e.g. {"DEBUG": "1"}.'
    )
    timeout: int = Field(
        DEFAULT_TIMEOUT_MS,
        gt=0,
        le=MAX_TIMEOUT_MS,
        description="Milliseconds before the command and everything it started are killed.",
    )

    @field_validator("command")
    @classmethod
    def _no_nul_in_command(cls, command: str) -> str:
        if "\x00" in command:
            raise ValueError("the command contains a NUL byte, which no command line can hold")
        return command


def _description(cap_bytes: int) -> str:
    return (
        "Run a shell command (/bin/sh -c) in the workspace and get back JSON with stdout, "
        "stderr, exit_code, timed_out, duration_ms and usage (cpu_ms, max_rss_kb, pids_peak, "
        f"killed_processes, oom_killed). Each stream keeps its first {cap_in_words(cap_bytes)}. "
        "stdin is empty; there is no network access where the sandbox has a network namespace, "
        "unless the run was given a network: then HTTP and HTTPS to what it allows, through "
        "the proxy HTTP_PROXY names (a refusal is an HTTP 403 saying why). "
        "Processes left running in the background are killed when the command ends. "
        "Commands can change or destroy any file in the workspace, and nothing undoes them. "
        "Off unless enabled: offered only where the caller switched it on."
    )


class SandboxCommandTool(JsonAnswerTool):
    """What the tools that run the model's commands in the run's box share: the sandbox pool,
    off unless enabled, never run twice, their own output caps, a ``timeout`` argument."""

    pool = "sandbox"
    idempotent = False
    # The command is handed over last, after the launch and the command line are ready.
    admits_itself = True
    enabled_by_default = False
    caps_own_output = True
    reads_context = False
    workspace_effect = "adds"
    default_timeout_ms = DEFAULT_TIMEOUT_MS
    timeout_argument = "timeout"


class RunBashTool(SandboxCommandTool):
    """Runs a shell command in the workspace, isolated, and reports what it printed."""

    name = "run_bash"
    description = _description(DEFAULT_OUTPUT_CAP_BYTES)
    Args: ClassVar[type[BaseModel]] = RunBashArgs

    def __init__(self, workspace: Workspace, config: SandboxConfig | None = None) -> None:
        self._workspace = workspace
        self._config = (
            config if config is not None else SandboxConfig.from_settings(get_worker_settings())
        )
        # The model is told the cap this tool applies (TOOLQ_OUTPUT_CAP_BYTES), not the default.
        self.description = _description(self._config.output_cap_bytes)

    def execute(self, args: dict[str, Any]) -> str:
        cwd = working_directory(self._workspace, args.get("cwd"))
        config, timeout_ms = run_limited(self._config, args.get("timeout", DEFAULT_TIMEOUT_MS))
        result = run_command(
            args["command"],
            cwd=cwd,
            home=self._workspace.root,
            env=args.get("env") or {},
            timeout_ms=timeout_ms,
            config=config,
            before_start=admit_current_call,
            identity=self._workspace.owner,
        )
        answer = with_applied_limits(result, config, timeout_ms)
        if answer.usage is not None:
            report_usage(answer.usage)
        return answer.model_dump_json()


def run_limited(config: SandboxConfig, timeout_ms: int) -> tuple[SandboxConfig, int]:
    """The configuration and timeout a command of the running call runs under: the run's own
    limits where it asked (its time bounding the timeout), else ``config``'s."""
    limits = current_limits()
    if limits is not None and limits.timeout_s is not None:
        timeout_ms = min(timeout_ms, math.ceil(limits.timeout_s * 1000))
    return config.with_limits(limits), timeout_ms


def with_applied_limits(
    result: SandboxResult, config: SandboxConfig, timeout_ms: int
) -> CommandAnswer:
    """``result`` as the wire contract has it (its fields by name, but for which streams were
    cut), whose ``usage.limits`` says what the command ran under. Its ``cpu`` is the CPU limit
    its control group held (null where none was asked, or none could be held here: the worker's
    ``limits.sandbox.cpu_by`` says why)."""
    settings = config.settings
    applied = RunLimits(
        timeout_s=timeout_ms / 1000,
        memory_mb=settings.memory_mb,
        pids=settings.max_processes,
        cpu=result.usage.cpu_limit,
    )
    if result.limits_held is not None:  # a run's container: what its group holds
        held = result.limits_held
        applied = applied.model_copy(
            update={"memory_mb": held.memory_mb, "pids": held.pids, "cpu": held.cpu}
        )
    truncated = StreamsCut(stdout=result.stdout_truncated, stderr=result.stderr_truncated)
    answer = CommandAnswer.model_validate({**asdict(result), "truncated": truncated})
    usage = (answer.usage or ResourceUsage()).model_copy(update={"limits": applied})
    return answer.model_copy(update={"usage": usage})


def working_directory(workspace: Workspace, cwd: str | None) -> Path:
    """The directory a command runs in: the workspace root, or ``cwd`` below it."""
    if cwd is None or cwd in ("", "."):
        return workspace.root
    path = workspace.resolve(cwd)
    if not path.is_dir():
        what = "does not exist" if not path.exists() else "is not a directory"
        raise WorkspaceError(f"cwd {shown(cwd)} {what} in the workspace")
    return path
