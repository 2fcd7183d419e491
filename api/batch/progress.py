"""How far a batch has got: a live bar on a terminal, periodic lines elsewhere, and a summary."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from api.batch.figures import nearest_rank, pass_rate_line
from api.batch.record import BatchRecord

#: Seconds between progress lines when stderr is not a terminal.
PLAIN_INTERVAL_S = 5.0


@dataclass
class BatchStats:
    """Counts of the conversations this run finished, and their timings."""

    total: int
    ok: int = 0
    failed: int = 0
    tool_calls: int = 0
    tool_errors: int = 0
    #: Items with a score, and those of them that passed.
    scored: int = 0
    passed: int = 0
    durations: list[float] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    finished: float | None = None

    def add(self, line: Mapping[str, Any]) -> None:
        """Count a result line; ``NotABatchRecord`` for an object without an id."""
        record = BatchRecord.read(line)
        if record.status == "ok":
            self.ok += 1
        else:
            self.failed += 1
        self.tool_calls += len(record.tool_calls)
        self.tool_errors += record.tool_errors
        self.durations.append(record.duration_s or 0.0)
        if record.passed is not None:
            self.scored += 1
            self.passed += record.passed

    def begin(self) -> None:
        """The clock starts with the first conversation, not with the fleet's start-up."""
        self.started = time.monotonic()
        self.finished = None

    def stop(self) -> None:
        if self.finished is None:
            self.finished = time.monotonic()

    @property
    def done(self) -> int:
        return self.ok + self.failed

    @property
    def elapsed(self) -> float:
        return (self.finished or time.monotonic()) - self.started

    @property
    def rate(self) -> float:
        """Conversations finished per second."""
        return self.done / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def tool_rate(self) -> float:
        return self.tool_calls / self.elapsed if self.elapsed > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        return (self.total - self.done) / self.rate if self.rate > 0 else None

    @property
    def scores_text(self) -> str:
        """``3/4 passed`` once items have been scored, else nothing."""
        return f"{self.passed}/{self.scored} passed" if self.scored else ""


def progress_display(stats: BatchStats, console: Console) -> PlainProgress | BarProgress:
    """A bar when ``console`` is a terminal, plain lines every few seconds when not."""
    if console.is_terminal:
        return BarProgress(stats, console)
    return PlainProgress(stats, console)


def progress_line(stats: BatchStats) -> str:
    percent = f" ({100 * stats.done / stats.total:.0f}%)" if stats.total else ""
    eta = stats.eta_s
    scores = f"{stats.scores_text}, " if stats.scored else ""
    return (
        f"batch: {stats.done}/{stats.total} done{percent}, {stats.failed} failed, {scores}"
        f"{stats.rate:.1f} conversations/s, {stats.tool_rate:.1f} tool calls/s, "
        f"ETA {_readable_duration(eta) if eta is not None else '?'}"
    )


class PlainProgress:
    """A progress line to the console every ``interval_s``, and one when the batch stops."""

    def __init__(
        self, stats: BatchStats, console: Console, interval_s: float = PLAIN_INTERVAL_S
    ) -> None:
        self._stats = stats
        self._console = console
        self._interval_s = interval_s
        self._ticker: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._ticker = asyncio.get_running_loop().create_task(self._tick(), name="batch-progress")

    def update(self) -> None:
        pass  # lines come on a clock, not per result

    async def stop(self) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
            await asyncio.gather(self._ticker, return_exceptions=True)
            self._ticker = None
        self._print()

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self._interval_s)
            self._print()

    def _print(self) -> None:
        self._console.print(progress_line(self._stats), markup=False, soft_wrap=True)


class BarProgress:
    """A rich progress bar: done, failed, rate, tool calls per second, time left."""

    def __init__(self, stats: BatchStats, console: Console) -> None:
        self._stats = stats
        self._progress = Progress(
            TextColumn("[bold]batch"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("[red]{task.fields[failed]} failed"),
            TextColumn("[green]{task.fields[scores]}"),
            TextColumn("{task.fields[rate]:.1f} conv/s"),
            TextColumn("{task.fields[tool_rate]:.1f} tool calls/s"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=console,
        )
        self._task = self._progress.add_task(
            "batch", total=stats.total, failed=0, scores="", rate=0.0, tool_rate=0.0
        )

    def start(self) -> None:
        self._progress.start()

    def update(self) -> None:
        stats = self._stats
        self._progress.update(
            self._task,
            completed=stats.done,
            failed=stats.failed,
            scores=stats.scores_text,
            rate=stats.rate,
            tool_rate=stats.tool_rate,
        )

    async def stop(self) -> None:
        self.update()
        self._progress.stop()


@dataclass(frozen=True)
class BatchOutcome:
    """Everything the summary reports besides the counts of this run."""

    output: str
    bad_lines: int = 0
    already_done: int = 0
    already_failed: int = 0
    #: Items run again because their earlier line had status error.
    retried: int = 0
    #: Scored items in the whole output (this run's and earlier ones, each id's last line),
    #: and those of them that passed.
    scored: int = 0
    passed: int = 0
    interrupted: bool = False
    #: The batch stopped because of this error (the fleet unreachable, the disk full).
    error: str | None = None
    resume_command: str = ""


def summary_lines(stats: BatchStats, outcome: BatchOutcome) -> list[str]:
    """The end-of-batch report, a line per topic."""
    previously = ""
    if outcome.already_failed:
        previously = f" ({outcome.already_failed} of them with status error)"
    if outcome.error is not None:
        headline = "Stopped by an error"
    else:
        headline = "Interrupted" if outcome.interrupted else "Finished"
    lines = [
        f"{headline}: {stats.ok} ok, "
        f"{stats.failed} error, {outcome.bad_lines} bad lines skipped, "
        f"{outcome.already_done} already done{previously}"
        + (f", {outcome.retried} errors run again" if outcome.retried else ""),
    ]
    if outcome.scored:
        lines.append(pass_rate_line(outcome.passed, outcome.scored))
    p50, p95 = nearest_rank(stats.durations, 0.50), nearest_rank(stats.durations, 0.95)
    if p50 is not None and p95 is not None:
        lines.append(f"Conversation time: p50 {p50:.2f} s, p95 {p95:.2f} s")
    error_rate = 100 * stats.tool_errors / stats.tool_calls if stats.tool_calls else 0.0
    lines.append(
        f"Tool calls: {stats.tool_calls} ({stats.tool_rate:.1f}/s), {stats.tool_errors} failed "
        f"({error_rate:.1f}%)"
    )
    lines.append(f"Wall time: {_readable_duration(stats.elapsed)}; results in {outcome.output}")
    if outcome.interrupted or outcome.error is not None:
        left = stats.total - stats.done
        lines.append(
            f"{left} conversations did not finish and left no line; every finished one is saved."
        )
        lines.append(f"Resume with: {outcome.resume_command}")
    return lines


def _readable_duration(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"
