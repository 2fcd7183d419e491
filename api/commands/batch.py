"""``toolq batch``: run a JSONL file of conversations on the fleet, resumably."""

from __future__ import annotations

import asyncio
import contextlib
import resource
import shlex
import signal
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kombu.exceptions import OperationalError
from openai import OpenAIError
from redis.exceptions import RedisError
from rich.console import Console

from api.agents.client import ConversationClient
from api.batch.attempts import Attempt, AttemptLog, attempts_path
from api.batch.input_scan import InputScan, scan_input
from api.batch.items import BadLine, BatchItem, ItemLimits
from api.batch.progress import (
    BatchOutcome,
    BatchStats,
    progress_display,
    summary_lines,
)
from api.batch.results import ResultLog
from api.batch.runner import run_item, run_items
from api.batch.tag import batch_run_id, batch_tag_for_output
from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet, load_fleet
from api.conversation.placement import AgentsPool, Placement, fleet_started, place
from api.exceptions import ModelError, OutputBusyError
from api.model.client import ChatModel, model_api_from_env
from api.process.gc_tuning import tuned_for_many_conversations
from api.process.logs import configure_logging
from api.settings import OrchestratorSettings, get_settings
from worker.contract.errors import ToolqError

#: Bad input lines printed one by one; past this only their count (the summary has it too).
BAD_LINES_SHOWN = 100

#: Open files a batch needs besides one connection per conversation: Redis, the broker, logs.
FILES_BESIDES_CONVERSATIONS = 256

EXIT_OK, EXIT_FAILURES, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130


def run_batch_command(
    input_path: Path,
    output: Path,
    *,
    concurrency: int,
    model: str | None,
    err: Console,
    retry_errors: bool = False,
    on_fleet: bool = False,
) -> int:
    """Run every line of ``input_path`` not yet in ``output`` (and, with ``retry_errors``, those
    whose line there has status error); the exit code of ``toolq batch``.

    ``on_fleet``: the conversations run on agents workers, which ask the model themselves.
    """
    settings = get_settings()
    configure_logging(settings)
    if concurrency < 1:
        return _usage_error(err, f"--concurrency must be at least 1, not {concurrency}")
    if not input_path.is_file():
        return _usage_error(err, f"input file not found: {input_path}")
    if output.exists() and output.resolve() == input_path.resolve():
        return _usage_error(err, "the output file must not be the input file")
    allow_open_files(concurrency + FILES_BESIDES_CONVERSATIONS, err)
    placement = place(settings, agents_pool=AgentsPool.REQUIRED if on_fleet else AgentsPool.UNUSED)
    try:
        chat_model = None if placement.on_agents_pool else ChatModel.from_env(settings)
        if placement.starts_agents_worker:
            model_api_from_env()  # the local agents worker asks the model with this environment
    except (ModelError, OpenAIError) as exc:
        return _usage_error(err, f"no model API configured: {exc}")
    try:
        results = ResultLog.open(output)
    except (OSError, OutputBusyError) as exc:
        return _usage_error(err, f"cannot use {output} for results: {_reason(exc)}")
    where = attempts_path(output)
    try:
        attempts = AttemptLog.open(where)
    except OSError as exc:
        results.close()
        return _usage_error(err, f"cannot use {where} for the attempts: {_reason(exc)}")
    with results, attempts:
        _report_output(results, err)
        try:
            scan = scan_input(
                input_path,
                results.done,
                limits=ItemLimits.from_settings(settings),
                retry_errors=retry_errors,
            )
        except OSError as exc:
            return _usage_error(err, f"cannot read {input_path}: {_reason(exc)}")
        _report_bad_lines(scan.path, scan.bad_lines, err)
        stats = BatchStats(total=len(scan.pending))
        run = _BatchRun(
            scan, results, stats, placement, chat_model, model, concurrency, err, attempts
        )
        resume = _resume_command(input_path, output, concurrency, model, retry_errors, on_fleet)
        error: str | None = None
        interrupted = False
        try:
            if scan.pending:
                with fleet_started(settings, placement) as fleet_settings:
                    fleet = load_fleet(fleet_settings.redis_url).require_tools()
                    _report_bad_lines(scan.path, scan.refuse_unserved(fleet.unserved), err)
                    stats.total = len(scan.pending)
                    if scan.pending:
                        with tuned_for_many_conversations():
                            interrupted = asyncio.run(run.execute(fleet_settings, fleet))
        except KeyboardInterrupt:  # before the batch's own signal handling was in place
            interrupted = True
        # toolq's own refusals (no workers, no agents worker, a local stack that would not
        # start), then what the broker's and the system's libraries raise.
        except (ToolqError, RedisError, OperationalError, OSError, ValueError) as exc:
            error = _reason(exc)
            _say(err, f"error: {error}")
        finally:
            stats.stop()
    _print_summary(err, stats, scan, results, resume=resume, interrupted=interrupted, error=error)
    if error is not None:
        return EXIT_FAILURES
    if interrupted:
        return EXIT_INTERRUPTED
    failures = stats.failed + scan.already_failed + len(scan.bad_lines)
    return EXIT_FAILURES if failures else EXIT_OK


Runner = Callable[[BatchItem], Awaitable[dict[str, Any]]]


@dataclass
class _BatchRun:
    """The asynchronous part of a batch: every item through one runner, each line written once.

    In this process the runner shares one dispatcher, fleet and model among the conversations;
    on the agents pool it sends each there (and has no ``chat_model``).
    """

    scan: InputScan
    results: ResultLog
    stats: BatchStats
    placement: Placement
    chat_model: ChatModel | None
    default_model: str | None
    concurrency: int
    err: Console
    attempts: AttemptLog

    async def execute(self, settings: OrchestratorSettings, fleet: Fleet) -> bool:
        """Run the pending items; True when a signal stopped the batch."""
        display = progress_display(self.stats, self.err)

        async with self._runner(settings, fleet) as runner:

            def on_result(record: dict[str, Any]) -> None:
                self.results.append(record)
                self.stats.add(record)
                display.update()

            work = asyncio.create_task(
                run_items(
                    self.scan.items(),
                    # More workers than items would only wait for nothing.
                    concurrency=min(self.concurrency, len(self.scan.pending)),
                    runner=runner,
                    on_result=on_result,
                ),
                name="batch",
            )
            on_fleet = self.placement.on_agents_pool
            with _signals_cancel(work, self.err, on_fleet) as stopped:
                self.stats.begin()
                display.start()
                try:
                    await work
                except asyncio.CancelledError:
                    if not stopped.by:
                        raise
                finally:
                    self.stats.stop()
                    await display.stop()
            return bool(stopped.by)

    @contextlib.asynccontextmanager
    async def _runner(self, settings: OrchestratorSettings, fleet: Fleet) -> AsyncIterator[Runner]:
        tag = batch_tag_for_output(self.results.path)
        if self.placement.on_agents_pool:
            async with ConversationClient(settings) as client:
                await client.require_workers()

                async def on_fleet(item: BatchItem) -> dict[str, Any]:
                    attempt = self._fleet_attempt(item.id, batch_run_id(tag, item.id))
                    record = await client.run(
                        item, run_id=attempt.run_id, default_model=self.default_model
                    )
                    return attempt.counted_in(record)

                yield on_fleet
            return
        assert self.chat_model is not None, "a batch run here is given its model"
        async with Dispatcher(settings) as dispatcher, self.chat_model as model:

            async def here(item: BatchItem) -> dict[str, Any]:
                attempt = self.attempts.begin(item.id, batch_run_id(tag, item.id))
                return await run_item(
                    item,
                    model=model,
                    dispatcher=dispatcher,
                    fleet=fleet,
                    settings=settings,
                    run_id=attempt.run_id,
                    default_model=self.default_model,
                    timeout_s=settings.conversation_timeout_s,
                    attempt=attempt.number,
                    earlier_run_ids=attempt.earlier_run_ids,
                )

            yield here

    def _fleet_attempt(self, item_id: str, first_run_id: str) -> Attempt:
        """The attempt an item runs as on the agents pool: the one a stopped batch sent there
        and never saw finish, which may still run there (or its answer wait) and is collected,
        not started again; else a new one, as in this process."""
        last = self.attempts.last(item_id)
        if last is not None and last.on_fleet and item_id not in self.results.done:
            return last
        return self.attempts.begin(item_id, first_run_id, on_fleet=True)


@dataclass
class _Stop:
    by: str | None = None


@contextlib.contextmanager
def _signals_cancel(work: asyncio.Task[None], err: Console, on_fleet: bool) -> Iterator[_Stop]:
    """SIGINT and SIGTERM cancel ``work``: conversations in flight stop (on the fleet, this batch
    stops waiting for them), finished ones stay."""
    loop = asyncio.get_running_loop()
    stop = _Stop()

    def on_signal(signum: signal.Signals) -> None:
        if stop.by is not None:
            err.print("Still stopping: waiting for the cancelled conversations to unwind.")
            return
        stop.by = signum.name
        in_flight = (
            "conversations in flight go on on the agents workers and are collected on resume"
            if on_fleet
            else "conversations in flight are cancelled"
        )
        _say(err, f"{signum.name}: stopping; {in_flight}, finished ones are saved.")
        work.cancel()

    handled = (signal.SIGINT, signal.SIGTERM)
    for signum in handled:
        loop.add_signal_handler(signum, on_signal, signum)
    try:
        yield stop
    finally:
        for signum in handled:
            loop.remove_signal_handler(signum)


def allow_open_files(wanted: int, err: Console) -> None:
    """Raise the soft limit on open files towards ``wanted``, as far as the hard limit allows.

    Every conversation waiting on the model holds a connection, and a common default soft
    limit (1024) would make a batch of a thousand fail with "Too many open files".
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= wanted:
        return
    allowed = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if allowed > soft:
        resource.setrlimit(resource.RLIMIT_NOFILE, (allowed, hard))
    if allowed < wanted:
        _say(
            err,
            f"Warning: this concurrency needs about {wanted} open files and the limit is "
            f"{allowed}; raise it (ulimit -n) or lower --concurrency.",
        )


def _report_output(results: ResultLog, err: Console) -> None:
    if results.truncated_bytes:
        _say(
            err,
            f"{results.path}: removed an unfinished last line ({results.truncated_bytes} bytes) "
            "left by an interrupted run.",
        )
    if results.unreadable_lines:
        numbers = ", ".join(map(str, results.unreadable_lines[:10]))
        _say(
            err,
            f"{results.path}: ignoring {len(results.unreadable_lines)} lines that are not "
            f"results (lines {numbers}); their items will run again.",
        )


def _report_bad_lines(path: Path, bad_lines: list[BadLine], err: Console) -> None:
    for bad in bad_lines[:BAD_LINES_SHOWN]:
        _say(err, f"{path}:{bad.number}: skipped: {bad.reason}")
    hidden = len(bad_lines) - BAD_LINES_SHOWN
    if hidden > 0:
        err.print(f"{path}: ... and {hidden} more bad lines skipped.", markup=False)


def _print_summary(
    err: Console,
    stats: BatchStats,
    scan: InputScan,
    results: ResultLog,
    *,
    resume: str,
    interrupted: bool,
    error: str | None = None,
) -> None:
    outcome = BatchOutcome(
        output=str(results.path),
        bad_lines=len(scan.bad_lines),
        already_done=scan.already_done,
        already_failed=scan.already_failed,
        retried=scan.retried,
        scored=len(results.passed),
        passed=sum(results.passed.values()),
        interrupted=interrupted,
        error=error,
        resume_command=resume,
    )
    for line in summary_lines(stats, outcome):
        _say(err, line)


def _resume_command(
    input_path: Path,
    output: Path,
    concurrency: int,
    model: str | None,
    retry_errors: bool,
    on_fleet: bool = False,
) -> str:
    argv = ["toolq", "batch", str(input_path), "-o", str(output), "--concurrency", str(concurrency)]
    if model:
        argv += ["--model", model]
    if retry_errors:
        argv.append("--retry-errors")
    if on_fleet:
        argv.append("--on-fleet")
    return shlex.join(argv)


def _say(err: Console, text: str) -> None:
    """A line to the user as it is: no markup read into paths or errors, long lines whole."""
    err.print(text, markup=False, soft_wrap=True)


def _usage_error(err: Console, message: str) -> int:
    _say(err, f"error: {message}")
    return EXIT_USAGE


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc)
