"""A run's workspace on the fleet, reached through the queue: files in and out, and commands with
their own argv, input and output limit.

For callers that prepare and inspect runs (batch tasks, sandbox environments); the model's own
tool calls go through the Agent. Every operation is a call of a service operation
(worker/tools/service.py) with the deadlines, caps and at-most-once rules of any tool call, so it
works where the caller shares no disk with the workers.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from api.dispatch import Dispatcher
from api.fleet import Fleet
from worker.contract.errors import ErrorKind
from worker.contract.settings import FleetSettings
from worker.contract.wire import CommandAnswer

FileProblemKind = Literal[
    "not_found", "is_a_directory", "not_a_regular_file", "too_large", "refused", "in_use"
]
#: Between two tries at removing a workspace another call of the run holds.
_FIRST_PAUSE_S = 0.1
_LONGEST_PAUSE_S = 2.0


class ServiceCallError(RuntimeError):
    """A service operation was not carried out: nobody serves it, nobody answered, or the worker
    refused the call. ``kind`` is the call's error kind."""

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class FileProblemError(RuntimeError):
    """A path the operation could not use; ``kind`` says why."""

    def __init__(self, kind: FileProblemKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True, slots=True)
class CollectedFile:
    content: str
    encoding: Literal["utf-8", "base64"]
    size: int
    truncated: bool

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True, slots=True)
class Collected:
    files: dict[str, CollectedFile]
    #: How many files matched, including those past ``max_files``.
    matched: int


class CommandResult(CommandAnswer):
    """What a command did, as run_bash reports it, and the worker that ran it."""

    worker: str | None = None


def calls_end_within_s(settings: FleetSettings) -> float:
    """How long a call sent before now may still be running on the fleet: its longest deadline,
    the grace of the hard limit past it, and the margin for the answer."""
    return settings.max_timeout_ms / 1000 + settings.hard_limit_grace_s + settings.reply_margin_s


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
        wire = {
            path: content
            if isinstance(content, str)
            else {"base64": base64.b64encode(content).decode("ascii")}
            for path, content in files.items()
        }
        answer = await self._call("toolq.put_files", {"files": wire}, timeout_ms)
        written: dict[str, int] = answer["written"]
        return written

    async def read_file(
        self, path: str, *, max_bytes: int | None = None, timeout_ms: int | None = None
    ) -> bytes:
        """One whole file; ``FileProblemError`` when it is missing, a directory, too large..."""
        arguments: dict[str, Any] = {"path": path}
        if max_bytes is not None:
            arguments["max_bytes"] = max_bytes
        answer = await self._call("toolq.read_file", arguments, timeout_ms)
        return base64.b64decode(answer["base64"])

    async def collect_files(
        self,
        patterns: Sequence[str],
        *,
        max_files: int = 100,
        max_file_bytes: int = 51_200,
        timeout_ms: int | None = None,
    ) -> Collected:
        """The regular files matching workspace-relative globs, each cut at ``max_file_bytes``."""
        answer = await self._call(
            "toolq.collect_files",
            {
                "patterns": list(patterns),
                "max_files": max_files,
                "max_file_bytes": max_file_bytes,
            },
            timeout_ms,
        )
        files = {path: CollectedFile(**found) for path, found in answer["files"].items()}
        return Collected(files, int(answer["matched"]))

    async def run(
        self,
        command: str | Sequence[str],
        *,
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: Mapping[str, str] | None = None,
        timeout_ms: int = 30_000,
        output_cap_bytes: int = 51_200,
    ) -> CommandResult:
        """Run a shell command line (a string) or an argv (a sequence) in the sandbox pool, with
        run_bash's isolation, in the workspace (or ``cwd`` below it)."""
        arguments: dict[str, Any] = {
            "timeout_ms": timeout_ms,
            "output_cap_bytes": output_cap_bytes,
            "env": dict(env or {}),
        }
        if isinstance(command, str):
            arguments["command"] = command
        else:
            arguments["argv"] = list(command)
        if cwd is not None:
            arguments["cwd"] = cwd
        if isinstance(input, str):
            arguments["input"] = input
        elif input is not None:
            arguments["input"] = {"base64": base64.b64encode(input).decode("ascii")}
        answer, worker = await self._call_with_worker("toolq.exec", arguments, None)
        return CommandResult.model_validate({**answer, "worker": worker})

    async def remove(self, *, timeout_ms: int | None = None, wait_s: float = 0.0) -> bool:
        """Remove the whole workspace; whether there was one.

        A workspace is never removed while another call of the run is in flight: it is tried
        again until ``wait_s`` seconds have passed (``calls_end_within_s`` waits for any call
        sent before), then ``FileProblemError`` ("in_use") says so.
        """
        give_up = time.monotonic() + wait_s
        pause = _FIRST_PAUSE_S
        while True:
            answer = await self._call("toolq.remove_workspace", {}, timeout_ms)
            kept = answer.get("kept")
            if kept is None:
                return bool(answer["removed"])
            if time.monotonic() + pause > give_up:
                raise FileProblemError(
                    "in_use", f"the workspace of run {self.run_id} was kept: {kept}"
                )
            await asyncio.sleep(pause)
            pause = min(pause * 2, _LONGEST_PAUSE_S)

    async def runs_beside(self, prefix: str, *, timeout_ms: int | None = None) -> list[str]:
        """The other runs with a workspace on the fleet whose ids start with ``prefix`` (at
        most 10,000 at a time: remove some and ask again for the rest)."""
        answer = await self._call("toolq.list_workspaces", {"prefix": prefix}, timeout_ms)
        return [str(run) for run in answer["runs"]]

    async def _call(
        self, operation: str, arguments: dict[str, Any], timeout_ms: int | None
    ) -> dict[str, Any]:
        answer, _ = await self._call_with_worker(operation, arguments, timeout_ms)
        return answer

    async def _call_with_worker(
        self, operation: str, arguments: dict[str, Any], timeout_ms: int | None
    ) -> tuple[dict[str, Any], str | None]:
        spec = self._fleet.tools.get(operation)
        if spec is None:
            raise ServiceCallError(
                f"no worker of this fleet offers {operation} (workers of an older toolq?)",
                "unknown_tool",
            )
        request = self._dispatcher.build_request(
            spec,
            task_id=f"{self.run_id}.{operation}.{uuid.uuid4().hex[:16]}",
            run_id=self.run_id,
            arguments=arguments,
            timeout_ms=timeout_ms,
        )
        result = await self._dispatcher.call(request, spec.pool)
        if result.is_error:
            raise ServiceCallError(result.output, result.error_kind)
        answer: dict[str, Any] = json.loads(result.output)
        if not answer.get("ok", False):
            raise FileProblemError(answer["error"], answer["message"])
        return answer, result.worker
