"""Batch runs: conversations read from a JSONL file, results appended to a resumable JSONL file.

The output is the batch's only state. Each finished conversation is appended as one whole line,
so after Ctrl-C, a crash or a kill the ids already in the output are the ones that are done, and
running the same batch again runs only the rest.
"""

from __future__ import annotations

import asyncio
import fcntl
import hashlib
import inspect
import json
import logging
import os
import re
import time
from collections.abc import (
    AsyncIterable,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
)
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.agent import DEFAULT_SYSTEM_PROMPT, Agent, AgentOptions
from api.dispatch import Dispatcher
from api.fleet import Fleet
from api.llm import ChatModel, ModelError, Usage
from api.logs import log_context
from worker.settings import Settings

log = logging.getLogger(__name__)

#: How often, at most, finished lines are forced to disk while a batch runs (and once at the end).
#: A killed process loses nothing either way: every line is in the kernel as soon as it is written.
#: Only a machine crash can lose the last few seconds of lines, and a rerun simply redoes those.
FSYNC_INTERVAL_S = 5.0

#: Characters of an item id kept in its run_id; the hash suffix keeps shortened ids apart.
RUN_ID_ITEM_CHARS = 40

Status = Literal["ok", "error"]


class BatchItem(BaseModel):
    """One conversation of a batch: a line of the input file."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Unique within the file; names the output line.")
    prompt: str = Field(min_length=1, description="The user's message.")
    system_prompt: str | None = Field(None, description="Default: the agent's system prompt.")
    model: str | None = Field(None, description="Default: --model, else TOOLQ_MODEL.")
    enable: list[str] = Field(default_factory=list, description="Tools to switch on.")
    max_turns: int | None = Field(None, gt=0, le=1000, description="Default: TOOLQ_MAX_TURNS.")


# --- Reading the input ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BadLine:
    """An input line that was skipped, and why."""

    number: int
    reason: str


def parse_item(raw: bytes | str) -> BatchItem:
    """One input line as an item; ``ValueError`` says what is wrong with it."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {_json_kind(value)}")
    try:
        return BatchItem.model_validate(value)
    except ValidationError as exc:
        raise ValueError(_describe(exc)) from None


def _json_kind(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _describe(exc: ValidationError) -> str:
    allowed = ", ".join(BatchItem.model_fields)
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "missing":
            problems.append(f"missing {where!r}")
        elif error["type"] == "extra_forbidden":
            problems.append(f"unknown field {where!r} (fields: {allowed})")
        else:
            problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)


@dataclass
class InputScan:
    """What an input file holds: its bad lines, the ids done before, the lines still to run."""

    path: Path
    bad_lines: list[BadLine] = field(default_factory=list)
    already_done: int = 0
    already_failed: int = 0
    pending: list[int] = field(default_factory=list)

    def items(self) -> Iterator[BatchItem]:
        """The items still to run, read again from the file as they are needed."""
        wanted = set(self.pending)
        for number, raw in _numbered_lines(self.path):
            if number in wanted:
                try:
                    yield parse_item(raw)
                except ValueError as exc:  # the file changed since the scan
                    log.warning("%s:%d: skipped: %s", self.path, number, exc)


def scan_input(path: Path, done: Mapping[str, str]) -> InputScan:
    """Check every line; ``done`` maps the ids already in the output to their status.

    Blank lines are ignored. A repeated id is a bad line: the first line with it is the item.
    """
    scan = InputScan(path)
    first_line: dict[str, int] = {}
    for number, raw in _numbered_lines(path):
        if not raw.strip():
            continue
        try:
            item = parse_item(raw)
        except ValueError as exc:
            scan.bad_lines.append(BadLine(number, str(exc)))
            continue
        if item.id in first_line:
            reason = f"duplicate id {item.id!r} (first on line {first_line[item.id]})"
            scan.bad_lines.append(BadLine(number, reason))
            continue
        first_line[item.id] = number
        status = done.get(item.id)
        if status is None:
            scan.pending.append(number)
        else:
            scan.already_done += 1
            if status != "ok":
                scan.already_failed += 1
    return scan


def _numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    with path.open("rb") as lines:
        yield from enumerate(lines, start=1)


# --- The output ----------------------------------------------------------------------------------


class OutputBusyError(RuntimeError):
    """Another batch is appending to this output file right now."""


class ResultLog:
    """The output JSONL: which ids are done, and appends of whole lines that survive a kill.

    ``open`` takes an exclusive lock (two batches on one output would run items twice), drops a
    partial last line left by a kill mid-write, and reads the ids already there.
    """

    def __init__(self, path: Path, *, fsync_interval_s: float = FSYNC_INTERVAL_S) -> None:
        self.path = path
        self.done: dict[str, str] = {}
        self.truncated_bytes = 0
        self.unreadable_lines: list[int] = []
        self._fsync_interval_s = fsync_interval_s
        self._fd: int | None = None
        self._last_sync = 0.0

    @classmethod
    def open(cls, path: Path, *, fsync_interval_s: float = FSYNC_INTERVAL_S) -> ResultLog:
        results = cls(path, fsync_interval_s=fsync_interval_s)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputBusyError(
                    f"another toolq batch is writing {path}; wait for it or stop it first"
                ) from None
            results.truncated_bytes = truncate_partial_line(fd)
            results.done, results.unreadable_lines = read_done(path)
        except BaseException:
            os.close(fd)
            raise
        results._fd = fd
        results._last_sync = time.monotonic()
        return results

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, in one system call, so no reader sees half of it."""
        if self._fd is None:
            raise ValueError(f"{self.path} is not open")
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        written = os.write(self._fd, line)
        while written < len(line):  # only a full disk or a quota stops a file write short
            written += os.write(self._fd, line[written:])
        self.done[str(record["id"])] = str(record["status"])
        now = time.monotonic()
        if now - self._last_sync >= self._fsync_interval_s:
            os.fsync(self._fd)
            self._last_sync = now

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def truncate_partial_line(fd: int, chunk: int = 65_536) -> int:
    """Cut the file after its last newline; returns the bytes removed."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - chunk)
        data = os.pread(fd, end - start, start)
        newline = data.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    else:
        keep = 0
    if keep < size:
        os.ftruncate(fd, keep)
    return size - keep


def read_done(path: Path) -> tuple[dict[str, str], list[int]]:
    """Ids in the output with their status, and the numbers of lines that are not records."""
    done: dict[str, str] = {}
    unreadable: list[int] = []
    for number, raw in _numbered_lines(path):
        try:
            record = json.loads(raw)
            done[str(record["id"])] = str(record.get("status", "error"))
        except (ValueError, TypeError, KeyError):
            unreadable.append(number)
    return done, unreadable


# --- Running ------------------------------------------------------------------------------------

_NOT_IN_RUN_ID = re.compile(r"[^A-Za-z0-9._-]+")


def batch_key(output: Path) -> str:
    """Names a batch by its output file: reruns with the same output use the same workspaces."""
    return hashlib.sha256(str(output.resolve()).encode()).hexdigest()[:8]


def batch_run_id(key: str, item_id: str) -> str:
    """A run_id (and so a workspace) per item: readable, valid, and distinct for distinct ids."""
    readable = _NOT_IN_RUN_ID.sub("_", item_id)[:RUN_ID_ITEM_CHARS]
    digest = hashlib.sha256(item_id.encode()).hexdigest()[:6]
    return f"b-{key}-{readable}-{digest}"


async def run_item(
    item: BatchItem,
    *,
    model: ChatModel,
    dispatcher: Dispatcher,
    fleet: Fleet,
    settings: Settings,
    run_id: str,
    default_model: str | None = None,
) -> dict[str, Any]:
    """Run one conversation to its output record; a failure is a record with status "error".

    Raises only ``CancelledError``.
    """
    started = time.perf_counter()
    model_name = item.model or default_model or settings.model
    agent: Agent | None = None
    with log_context(run_id=run_id):
        try:
            options = AgentOptions(
                model=model_name,
                run_id=run_id,
                enable=item.enable,
                max_turns=item.max_turns or settings.max_turns,
                system_prompt=item.system_prompt or DEFAULT_SYSTEM_PROMPT,
            )
            agent = Agent(model, options, dispatcher=dispatcher, fleet=fleet, settings=settings)
            answer = await agent.chat(item.prompt)
        except (ModelError, ValueError) as exc:
            log.warning("conversation %r failed: %s", item.id, exc)
            return _record(item, run_id, model_name, agent, started, error=str(exc))
        except Exception as exc:  # a bug must cost one conversation, not the whole batch
            log.exception("conversation %r failed unexpectedly", item.id)
            error = f"unexpected {type(exc).__name__}: {exc}"
            return _record(item, run_id, model_name, agent, started, error=error)
        finally:
            if agent is not None:
                await agent.close()
        log.debug("conversation %r finished: %s", item.id, agent.stop_reason)
        return _record(item, run_id, model_name, agent, started, answer=answer)


def _record(
    item: BatchItem,
    run_id: str,
    model_name: str,
    agent: Agent | None,
    started: float,
    *,
    answer: str | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """The output line: what the conversation said and did, as far as it got."""
    transcript = (
        agent.transcript()
        if agent is not None
        else {
            "model": model_name,
            "stop_reason": None,
            "messages": [],
            "tool_calls": [],
            "usage": asdict(Usage()),
        }
    )
    status: Status = "ok" if error is None else "error"
    return {
        "id": item.id,
        "status": status,
        "answer": answer,
        "error": error,
        "stop_reason": transcript["stop_reason"],
        "run_id": run_id,
        "model": transcript["model"],
        "duration_s": round(time.perf_counter() - started, 3),
        "usage": transcript["usage"],
        "tool_calls": transcript["tool_calls"],
        "messages": transcript["messages"],
    }


async def run_items(
    items: AsyncIterable[BatchItem] | Iterable[BatchItem],
    *,
    concurrency: int,
    runner: Callable[[BatchItem], Awaitable[dict[str, Any]]],
    on_result: Callable[[dict[str, Any]], Awaitable[None] | None],
) -> None:
    """Run every item through ``runner``, ``concurrency`` at a time, passing each result on.

    ``concurrency`` coroutines pull items as they free up, so a file of any size costs that many
    tasks. A runner or ``on_result`` that raises stops the others and the error propagates;
    cancelling this cancels every conversation in flight.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be at least 1, not {concurrency}")
    next_item = _puller(items)

    async def work() -> None:
        while (item := await next_item()) is not None:
            result = await runner(item)
            handled = on_result(result)
            if inspect.isawaitable(handled):
                await handled

    workers = [asyncio.create_task(work(), name=f"batch-{n}") for n in range(concurrency)]
    try:
        await asyncio.gather(*workers)
    finally:
        for worker in workers:
            worker.cancel()
        await asyncio.gather(*workers, return_exceptions=True)


def _puller(
    items: AsyncIterable[BatchItem] | Iterable[BatchItem],
) -> Callable[[], Awaitable[BatchItem | None]]:
    """The next item, or None at the end, safe to await from many coroutines at once."""
    if isinstance(items, AsyncIterable):
        iterator = aiter(items)
        # An async generator refuses a second anext() while the first is suspended.
        lock = asyncio.Lock()

        async def pull_async() -> BatchItem | None:
            async with lock:
                return await anext(iterator, None)

        return pull_async

    sync_iterator = iter(items)

    async def pull() -> BatchItem | None:
        return next(sync_iterator, None)

    return pull
