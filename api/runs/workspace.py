"""A run's workspace on the fleet, reached through the queue: files in and out, and commands with
their own argv, input and output limit.

For callers that prepare and inspect runs (batch tasks, sandbox environments); the model's own
tool calls go through the Agent. Every operation is a call of a service operation
(``worker.contract.operations``) with the deadlines, caps and at-most-once rules of any tool
call, so it works where the caller shares no disk with the workers.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import shlex
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.exceptions import FileProblemError, ServiceCallError
from worker.contract import operations
from worker.contract.deadlines import EXEC_TIMEOUT_MS
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, MAX_COLLECTED_FILES
from worker.contract.operations import AnswerT, Operation, RequestT
from worker.contract.settings import FleetSettings
from worker.contract.wire import CommandAnswer, ToolCallResult, ToolSpec

#: The built-in tool that keeps a run's shells (``worker.tools.bash_session``).
SESSION_TOOL = "bash_session"
#: The run's session kept for programs that must outlive their call (``keep_running``).
KEPT_SESSION = "kept"
#: Between two tries at removing a workspace another call of the run holds.
_FIRST_PAUSE_S = 0.1
_LONGEST_PAUSE_S = 2.0


class CommandResult(CommandAnswer):
    """What a command did, as run_bash reports it, and the worker that ran it."""

    worker: str | None = None


def calls_end_within_s(settings: FleetSettings) -> float:
    """How long a call sent before now may still be running on the fleet: its longest deadline,
    the grace of the hard limit past it, and the margin for the answer."""
    return settings.max_timeout_ms / 1000 + settings.hard_limit_grace_s + settings.reply_margin_s


async def call_operation(
    dispatcher: Dispatcher,
    spec: ToolSpec,
    run_id: str,
    arguments: dict[str, Any],
    *,
    pool: str,
    timeout_ms: int | None = None,
) -> ToolCallResult:
    """A call of service operation ``spec`` (``worker.contract.operations``) for run ``run_id``,
    sent and waited for as ``Dispatcher.call`` does; its task id names the run and the
    operation, apart from the model's calls."""
    request = dispatcher.build_request(
        spec,
        task_id=f"{run_id}.{spec.name}.{uuid.uuid4().hex[:16]}",
        run_id=run_id,
        arguments=arguments,
        timeout_ms=timeout_ms,
    )
    return await dispatcher.call(request, pool)


class RunWorkspace:
    """The workspace of run ``run_id`` on the fleet that ``fleet`` describes."""

    def __init__(self, dispatcher: Dispatcher, fleet: Fleet, run_id: str) -> None:
        self._dispatcher = dispatcher
        self._fleet = fleet
        self.run_id = run_id

    async def put_files(
        self, files: Mapping[str, str | bytes], *, timeout_ms: int | None = None
    ) -> dict[str, int]:
        """Write files (text as UTF-8, bytes as they are); their sizes by path.

        ``FileProblemError`` for a path that cannot be written (a directory, outside the
        workspace...); the files before it in ``files`` are written.
        """
        with _checked(operations.PUT_FILES):
            request = operations.PutFilesRequest(
                files={path: _content(c) for path, c in files.items()}
            )
        answer, _ = await self._call(operations.PUT_FILES, request, timeout_ms)
        return answer.written

    async def read_file(
        self, path: str, *, max_bytes: int | None = None, timeout_ms: int | None = None
    ) -> bytes:
        """One whole file; ``FileProblemError`` when it is missing, a directory, too large..."""
        with _checked(operations.READ_FILE):
            request = operations.ReadFileRequest(path=path, max_bytes=max_bytes)
        answer, _ = await self._call(operations.READ_FILE, request, timeout_ms)
        return answer.data()

    async def collect_files(
        self,
        patterns: Sequence[str],
        *,
        max_files: int = MAX_COLLECTED_FILES,
        max_file_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
        timeout_ms: int | None = None,
    ) -> operations.CollectFilesAnswer:
        """The regular files matching workspace-relative globs, each cut at ``max_file_bytes``,
        and how many matched."""
        with _checked(operations.COLLECT_FILES):
            request = operations.CollectFilesRequest(
                patterns=list(patterns), max_files=max_files, max_file_bytes=max_file_bytes
            )
        answer, _ = await self._call(operations.COLLECT_FILES, request, timeout_ms)
        return answer

    async def run(
        self,
        command: str | Sequence[str],
        *,
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int = EXEC_TIMEOUT_MS,
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
    ) -> CommandResult:
        """Run a shell command line (a string) or an argv (a sequence) in the sandbox pool, with
        run_bash's isolation, in the workspace (or ``cwd`` below it)."""
        with _checked(operations.EXEC):
            request = operations.ExecRequest(
                command=command if isinstance(command, str) else None,
                argv=None if isinstance(command, str) else list(command),
                input=None if input is None else _content(input),
                cwd=cwd,
                env=dict(env or {}),
                timeout_ms=timeout_ms,
                output_cap_bytes=output_cap_bytes,
            )
        answer, worker = await self._call(operations.EXEC, request, None)
        return CommandResult.model_validate({**dict(answer), "worker": worker})

    async def keep_running(
        self,
        command: Sequence[str],
        *,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int,
    ) -> CommandResult:
        """Start ``command`` (an argv) in the run's shell session kept for programs that must
        outlive their call (a server the run's later commands talk to): in the run's box, as
        run_bash's commands, until the run ends (``bash_session``, session ``KEPT_SESSION``).
        Its answer as a command's: its exit status (-1 while it still runs), the terminal's
        output as its stdout."""
        argv = [*(f"{name}={value}" for name, value in (env or {}).items()), *command]
        line = shlex.join(["cd", "-P", "--", cwd or "."]) + " && " + shlex.join(["env", *argv])
        arguments = {"action": "type_submit", "input": line, "session": KEPT_SESSION}
        result = await self._result(SESSION_TOOL, {**arguments, "timeout": timeout_ms}, timeout_ms)
        answer = json.loads(result.output)
        exit_code = answer["exit_code"] if answer["exit_code"] is not None else -1
        return CommandResult(
            stdout=answer["output"],
            stderr="",
            exit_code=exit_code,
            timed_out=False,
            duration_ms=int(result.duration_ms),
            worker=result.worker,
        )

    async def remove(self, *, timeout_ms: int | None = None, wait_s: float = 0.0) -> bool:
        """Remove the whole workspace; whether there was one.

        A workspace is never removed while another call of the run is in flight: it is tried
        again until ``wait_s`` seconds have passed (``calls_end_within_s`` waits for any call
        sent before), then ``FileProblemError`` ("in_use") says so.
        """
        give_up = time.monotonic() + wait_s
        pause = _FIRST_PAUSE_S
        while True:
            answer, _ = await self._call(
                operations.REMOVE_WORKSPACE, operations.NoArguments(), timeout_ms
            )
            if answer.kept is None:
                return answer.removed
            if time.monotonic() + pause > give_up:
                raise FileProblemError(
                    "in_use", f"the workspace of run {self.run_id} was kept: {answer.kept}"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)

    async def runs_beside(self, prefix: str, *, timeout_ms: int | None = None) -> list[str]:
        """The other runs with a workspace on the fleet whose ids start with ``prefix`` (at
        most ``MAX_LISTED_RUNS`` at a time: remove some and ask again for the rest)."""
        with _checked(operations.LIST_WORKSPACES):
            request = operations.ListWorkspacesRequest(prefix=prefix)
        answer, _ = await self._call(operations.LIST_WORKSPACES, request, timeout_ms)
        return answer.runs

    async def _call(
        self,
        operation: Operation[RequestT, AnswerT, operations.FileRefusal],
        request: RequestT,
        timeout_ms: int | None,
    ) -> tuple[AnswerT, str | None]:
        """The operation's answer, and the worker that gave it."""
        result = await self._result(operation.name, operation.arguments(request), timeout_ms)
        # An answer of another form (a worker of another version) is no refusal: its
        # ValueError goes up as the fault it is.
        answer = operation.read_answer(result.output)
        if isinstance(answer, operations.FileRefusal):
            raise FileProblemError(answer.error, answer.message)
        return answer, result.worker

    async def _result(
        self, tool: str, arguments: dict[str, Any], timeout_ms: int | None
    ) -> ToolCallResult:
        """The call of ``tool`` for the run; ``ServiceCallError`` when it failed."""
        spec = self._fleet.tools.get(tool)
        if spec is None:
            raise ServiceCallError(
                f"no worker of this fleet offers {tool} (workers of an older toolq?)",
                "unknown_tool",
            )
        result = await call_operation(
            self._dispatcher, spec, self.run_id, arguments, pool=spec.pool, timeout_ms=timeout_ms
        )
        if result.is_error:
            raise ServiceCallError(result.output, result.error_kind)
        return result


@contextlib.contextmanager
def _checked(operation: Operation[Any, Any, Any]) -> Iterator[None]:
    """A request the worker would refuse is refused here, as the worker words it."""
    try:
        yield
    except ValidationError as exc:
        raise ServiceCallError(
            f"Error: invalid arguments for {operation.name}: {operations.request_problems(exc)}.",
            "invalid_arguments",
        ) from None


def _content(content: str | bytes) -> operations.Content:
    """Text as it is; bytes as base64."""
    if isinstance(content, str):
        return content
    return {"base64": base64.b64encode(content).decode("ascii")}
