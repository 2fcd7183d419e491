"""Inspect's sandbox contract in terms of the fleet's answers: a command's result as an
``ExecResult`` or the exception Inspect documents for it, and a file problem or a failed call as
the ``OSError``, ``TimeoutError`` or ``SandboxUnavailableError`` its callers expect."""

from __future__ import annotations

import errno
import shlex

from inspect_ai.util import (
    ExecResult,
    OutputLimitExceededError,
    SandboxEnvironmentLimits,
    SandboxUnavailableError,
)
from inspect_ai.util._sandbox.events import SandboxTimeoutError

from api.exceptions import FileProblemError, ServiceCallError, ToolqSandboxError
from api.runs.workspace import CommandResult

#: Call failures that mean the sandbox could not be reached, not that the operation failed.
UNREACHABLE_KINDS = frozenset(
    {"no_answer", "broker_unavailable", "unknown_tool", "wrong_pool", "interrupted"}
)


def exec_outcome(result: CommandResult, cmd: list[str], timeout_s: float) -> ExecResult[str]:
    """The result Inspect expects from ``exec``, or the exception it documents instead."""
    if result.timed_out:
        partial = result.stdout + result.stderr
        raise SandboxTimeoutError(
            f"Command timed out after {timeout_s:g} seconds: {shlex.join(cmd)[:200]}",
            truncated_output=partial or None,
        )
    if result.truncated.stdout or result.truncated.stderr:
        raise OutputLimitExceededError(
            limit_str=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE_STR,
            truncated_output=result.stdout if result.truncated.stdout else result.stderr,
        )
    # The shell that starts the command says so when the program itself cannot be run; the
    # command's own "Permission denied" (a script it runs, say) names another file.
    if result.exit_code == 126 and f"{cmd[0]}: Permission denied" in result.stderr:
        raise PermissionError(errno.EACCES, "Permission denied", cmd[0])
    return ExecResult(
        success=result.exit_code == 0,
        returncode=result.exit_code,
        stdout=result.stdout,
        stderr=result.stderr,
    )


def file_error(problem: FileProblemError, file: str) -> Exception:
    """The exception Inspect documents for a path the fleet could not use."""
    if problem.kind == "not_found":
        return FileNotFoundError(errno.ENOENT, "No such file or directory", file)
    if problem.kind == "is_a_directory":
        return IsADirectoryError(errno.EISDIR, "Is a directory", file)
    if problem.kind == "too_large":
        return OutputLimitExceededError(
            limit_str=SandboxEnvironmentLimits.MAX_READ_FILE_SIZE_STR, truncated_output=None
        )
    if problem.kind == "not_a_regular_file":
        return OSError(errno.EINVAL, f"Not a regular file ({problem})", file)
    return PermissionError(errno.EACCES, f"Permission denied ({problem})", file)


def call_error(failure: ServiceCallError, what: str) -> Exception:
    """The exception for a call the fleet did not carry out."""
    if failure.kind == "timeout":
        return TimeoutError(f"{what} ran past its deadline on the toolq fleet: {failure}")
    if failure.kind in UNREACHABLE_KINDS:
        return SandboxUnavailableError(f"the toolq fleet did not carry out {what}: {failure}")
    return ToolqSandboxError(f"the toolq fleet refused {what}: {failure}")
