"""An item as a task: its workspace prepared before the conversation (files, set-up command) and
judged and collected after it (target, check command, artifacts).

Everything goes through the fleet's service operations (``api.runs.workspace``): files and
artifacts through the tools pool, commands through the sandbox pool with run_bash's isolation,
so a task runs the same where the orchestrator shares no disk with the workers.
"""

from __future__ import annotations

from collections.abc import Awaitable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from api.batch.items import BatchItem, ItemLimits
from api.calls.fleet import Fleet
from api.exceptions import FileProblemError, ImageUnavailable, ServiceCallError, TaskFailed
from api.runs.environment import RunEnvironment
from api.runs.workspace import CommandResult, RunWorkspace
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, MAX_COLLECTED_FILES
from worker.contract.operations import EXEC

_T = TypeVar("_T")

#: Characters of a failed set-up's stderr quoted in the item's error.
STDERR_TAIL_CHARS = 500
#: The answer in the check's environment is cut here: the kernel refuses a longer variable
#: (131,072 bytes). The check's standard input has the whole answer.
ANSWER_ENV_MAX_BYTES = 100_000
#: How the errors of a failed set-up and of a check that could not run begin.
SETUP_FAILED = "setup failed"
CHECK_NOT_RUN = "the check could not run"


@dataclass
class TaskResults:
    """What the task adds to the item's result line: each field the line's field of that name
    (``vars``, not ``asdict``, which would copy the artifacts)."""

    setup: dict[str, Any] | None = None
    check: dict[str, Any] | None = None
    score: dict[str, Any] | None = None
    artifacts: dict[str, Any] | None = None
    artifacts_matched: int | None = None
    #: The run's image: its reference and the digest it resolved to (``api.images``).
    image: dict[str, Any] | None = None


@dataclass(eq=False)
class Task:
    """The task part of one item, on the workspace of its run."""

    item: BatchItem
    workspace: RunWorkspace
    fleet: Fleet
    limits: ItemLimits
    #: The run's container, when the item has an image: started before its files are
    #: written, so that what the image has at its WorkingDir is there first.
    environment: RunEnvironment | None = None
    results: TaskResults = field(default_factory=TaskResults, init=False)

    async def prepare(self) -> None:
        """A fresh workspace with the item's files, then its set-up command; ``TaskFailed``
        when any of it did not work, and the model must not be asked."""
        item = self.item
        if not item.is_task:
            return
        # Each attempt has a workspace of its own (api.batch.attempts), so this one is new; but a
        # machine crash can lose an attempt's line, and then its workspace is used again: it
        # starts from the item's files alone, not from what that attempt left.
        await self._service("the workspace could not be prepared", self.workspace.remove())
        if self.environment is not None:
            try:
                started = await self.environment.start()
            except ImageUnavailable as exc:
                raise TaskFailed(str(exc)) from None
            self.results.image = {"reference": started.image, "digest": started.digest}
        if item.files:
            contents = item.file_contents()
            await self._service(
                "the files could not be written", self.workspace.put_files(contents)
            )
        if item.setup is None:
            return
        timeout_s = self.limits.command_timeout_s(item.setup_timeout_s)
        result = await self._command(f"{SETUP_FAILED}: it could not run", item.setup, timeout_s)
        self.results.setup = command_fields(result)
        if result.timed_out or result.exit_code != 0:
            raise TaskFailed(f"{SETUP_FAILED}: {_ending(result, timeout_s)}{_tail(result.stderr)}")

    async def judge(self, answer: str, stop_reason: str | None) -> None:
        """The score: the answer against the target, and the check command's exit code."""
        item = self.item
        verdicts: list[tuple[bool, str]] = []
        if item.target is not None:
            verdicts.append(target_verdict(answer, item.target))
        if item.check is not None:
            timeout_s = self.limits.command_timeout_s(item.check_timeout_s)
            env = {"TOOLQ_ANSWER": _env_value(answer), "TOOLQ_STOP_REASON": stop_reason or ""}
            result = await self._command(
                CHECK_NOT_RUN, item.check, timeout_s, env=env, input=answer
            )
            self.results.check = command_fields(result)
            verdicts.append(check_verdict(result, timeout_s))
        if not verdicts:
            return
        method = "both" if len(verdicts) == 2 else ("target" if item.target else "check")
        self.results.score = {
            "passed": all(passed for passed, _ in verdicts),
            "method": method,
            "explanation": verdicts[0][1]
            if len(verdicts) == 1
            else f"target: {verdicts[0][1]}\ncheck: {verdicts[1][1]}",
        }

    async def collect(self) -> None:
        """The files matching the item's artifact patterns: at most ``MAX_COLLECTED_FILES``,
        each cut at the output cap's default."""
        patterns = self.item.artifacts
        if patterns is None:
            return
        if not patterns:
            self.results.artifacts, self.results.artifacts_matched = {}, 0
            return
        collected = await self._service(
            "the artifacts could not be collected",
            self.workspace.collect_files(
                patterns, max_files=MAX_COLLECTED_FILES, max_file_bytes=DEFAULT_OUTPUT_CAP_BYTES
            ),
        )
        self.results.artifacts = {path: f.model_dump() for path, f in collected.files.items()}
        self.results.artifacts_matched = collected.matched

    async def finish(self) -> None:
        """End the run's container, whatever happened before."""
        if self.environment is not None:
            await self.environment.end()

    async def _command(
        self,
        failure: str,
        command: str,
        timeout_s: float,
        *,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
    ) -> CommandResult:
        if not self.fleet.serves(EXEC.name):
            raise TaskFailed(f"{failure}: no live worker serves the sandbox pool")
        return await self._service(
            failure,
            self.workspace.run(
                command,
                env=env,
                input=input,
                timeout_ms=round(timeout_s * 1000),
                # Each stream is cut here, the score's explanation (the check's stdout) too.
                output_cap_bytes=DEFAULT_OUTPUT_CAP_BYTES,
            ),
        )

    @staticmethod
    async def _service(failure: str, call: Awaitable[_T]) -> _T:
        try:
            return await call
        except (ServiceCallError, FileProblemError) as exc:
            raise TaskFailed(f"{failure}: {exc}") from None


def command_fields(result: CommandResult) -> dict[str, Any]:
    """A set-up or check command as the result line shows it."""
    return {
        "exit_code": result.exit_code,
        "duration_ms": result.duration_ms,
        "stdout": result.stdout,
        "stderr": result.stderr,
        "timed_out": result.timed_out,
    }


def target_verdict(answer: str, target: str) -> tuple[bool, str]:
    """Passed when the answer contains the target, whatever the case, the target's surrounding
    whitespace aside."""
    wanted = target.strip()
    if wanted.casefold() in answer.casefold():
        return True, f"the answer contains {wanted!r}"
    return False, f"the answer does not contain {wanted!r}"


def check_verdict(result: CommandResult, timeout_s: float) -> tuple[bool, str]:
    """Passed on exit code 0; the explanation is the check's stdout, and how it ended (with the
    end of its stderr) when it said nothing or ran out of time."""
    passed = result.exit_code == 0 and not result.timed_out
    parts = [result.stdout] if result.stdout.strip() else []
    if result.timed_out:
        parts.append(f"the check timed out after {timeout_s:g} s")
    elif not parts:
        parts.append(f"the check exited with code {result.exit_code}{_tail(result.stderr)}")
    return passed, "\n".join(parts)


def _ending(result: CommandResult, timeout_s: float) -> str:
    if result.timed_out:
        return f"timed out after {timeout_s:g} s (exit code {result.exit_code})"
    return f"exit code {result.exit_code}"


def _tail(stderr: str) -> str:
    text = stderr.strip()
    if not text:
        return ""
    cut = text[-STDERR_TAIL_CHARS:]
    return f": {'...' if len(cut) < len(text) else ''}{cut}"


def _env_value(answer: str) -> str:
    """The answer as an environment variable can hold it: no NUL, not over the kernel's size."""
    data = answer.replace("\x00", "").encode("utf-8", "replace")[:ANSWER_ENV_MAX_BYTES]
    return data.decode("utf-8", "ignore")
