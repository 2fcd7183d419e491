"""Running a batch's items: one conversation each (with its task around it, if it has one), so
many at a time, each to its output line."""

from __future__ import annotations

import asyncio
import inspect
import logging
import os
import socket
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from api.batch.items import BatchItem, ItemLimits
from api.batch.record import BatchLine, BatchRecord, TokenUsage
from api.batch.task import Task, TaskResults
from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.conversation.agent import DEFAULT_SYSTEM_PROMPT, Agent, AgentOptions
from api.exceptions import ModelError, TaskFailed
from api.model.client import ChatModel
from api.process.logs import log_context
from api.runs.environment import RunEnvironment
from api.runs.workspace import RunWorkspace
from api.settings import OrchestratorSettings

log = logging.getLogger(__name__)


async def run_item(
    item: BatchItem,
    *,
    model: ChatModel,
    dispatcher: Dispatcher,
    fleet: Fleet,
    settings: OrchestratorSettings,
    run_id: str,
    default_model: str | None = None,
    timeout_s: float | None = None,
    attempt: int = 1,
    earlier_run_ids: Sequence[str] = (),
) -> BatchLine:
    """Run one item to its output record: its workspace prepared, the conversation, then its
    score and artifacts. A failure is a record with status "error".

    ``timeout_s`` bounds the conversation. ``attempt`` counts the item's runs: a stop of the
    batch or an agents worker that died cut the earlier ones, or they ended in an error that
    ``--retry-errors`` runs again. ``earlier_run_ids`` names the workspaces of earlier runs that
    worked elsewhere (``api.batch.attempts``). Raises only ``CancelledError``.
    """
    started = time.perf_counter()
    model_name = item.model or default_model or settings.model
    environment = RunEnvironment.for_run(dispatcher, fleet, run_id, item)
    if item.network != "none":  # its setup and check too, not only the model's calls
        dispatcher.networks[run_id] = item.network
    if item.limits is not None:  # every call carries them: its setup and check too
        dispatcher.limits[run_id] = item.limits
    task = Task(
        item,
        RunWorkspace(dispatcher, fleet, run_id),
        fleet,
        ItemLimits.from_settings(settings),
        environment,
    )
    agent: Agent | None = None
    answer: str | None = None
    error: str | None = None
    limit = asyncio.timeout(timeout_s)
    with log_context(run_id=run_id):
        try:
            await task.prepare()
            options = AgentOptions(
                model=model_name,
                run_id=run_id,
                enable=item.enable,
                max_turns=item.max_turns or settings.max_turns,
                system_prompt=item.system_prompt or DEFAULT_SYSTEM_PROMPT,
                time_limit_s=item.time_limit_s,
                token_limit=item.token_limit,
                network=item.network,
                limits=item.limits,
            )
            agent = Agent(model, options, dispatcher=dispatcher, fleet=fleet, settings=settings)
            try:
                async with limit:
                    answer = await agent.chat(item.prompt)
            finally:
                await agent.close()
            log.debug("conversation %r finished: %s", item.id, agent.stop_reason)
            await task.judge(answer, agent.stop_reason)
        except (TaskFailed, ModelError, ValueError) as exc:
            log.warning("item %r failed: %s", item.id, exc)
            error = str(exc)
        except Exception as exc:  # a bug must cost one item, not the whole batch
            if limit.expired():
                log.warning("conversation %r ran past its %g s limit", item.id, timeout_s)
                error = time_limit_error(timeout_s)
            else:
                log.exception("item %r failed unexpectedly", item.id)
                error = f"unexpected {type(exc).__name__}: {exc}"
        error = await _collect(task, error)
        await _finish(task)
        dispatcher.networks.pop(run_id, None)
        dispatcher.limits.pop(run_id, None)
    record = _record(
        item,
        run_id,
        model_name,
        agent,
        started,
        task.results,
        answer,
        error,
        attempt,
        earlier_run_ids,
    )
    return record.line()


async def _collect(task: Task, error: str | None) -> str | None:
    """Bring the artifacts back, whatever happened before: they show what went wrong too. The
    item's error is the first that happened."""
    try:
        await task.collect()
    except TaskFailed as exc:
        log.warning("item %r: %s", task.item.id, exc)
        return error or str(exc)
    except Exception as exc:  # as in run_item: one item, not the batch
        log.exception("item %r: collecting its artifacts failed unexpectedly", task.item.id)
        return error or f"unexpected {type(exc).__name__}: {exc}"
    return error


async def _finish(task: Task) -> None:
    """End the run's container; a worker that cannot is swept later, the item stands."""
    try:
        await task.finish()
    except Exception:  # as in run_item: one item, not the batch
        log.exception("item %r: ending its container failed", task.item.id)


def time_limit_error(timeout_s: float | None) -> str:
    return f"the conversation did not finish within {timeout_s:g} s (TOOLQ_CONVERSATION_TIMEOUT_S)"


def process_name() -> str:
    """The process that ran a conversation, as its output line names it: ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def failed_record(
    item: BatchItem,
    run_id: str,
    model_name: str,
    error: str,
    *,
    attempts: int,
    ran_on: str | None,
    waited_s: float,
) -> BatchLine:
    """The output line of a conversation whose run never reported back: only why."""
    record = _record(
        item, run_id, model_name, None, time.perf_counter(), TaskResults(), None, error, attempts
    )
    return record.model_copy(
        update={"duration_s": round(waited_s, 3), "orchestrator": ran_on}
    ).line()


def _record(
    item: BatchItem,
    run_id: str,
    model_name: str,
    agent: Agent | None,
    started: float,
    results: TaskResults,
    answer: str | None,
    error: str | None,
    attempt: int,
    earlier_run_ids: Sequence[str] = (),
) -> BatchRecord:
    """The output line: what the item's conversation said and did, as far as it got (nothing,
    and no tokens, when it never began), and how the task went."""
    transcript = agent.transcript() if agent is not None else {}
    return BatchRecord(
        id=item.id,
        status="ok" if error is None else "error",
        answer=answer,
        error=error,
        stop_reason=transcript.get("stop_reason"),
        run_id=run_id,
        model=transcript.get("model", model_name),
        duration_s=round(time.perf_counter() - started, 3),
        attempts=attempt,
        earlier_run_ids=list(earlier_run_ids),
        orchestrator=process_name(),
        usage=transcript.get("usage", TokenUsage()),
        **vars(results),
        metadata=item.metadata,
        tool_calls=transcript.get("tool_calls", []),
        messages=transcript.get("messages", []),
    )


async def run_items(
    items: Iterable[BatchItem],
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
    iterator = iter(items)

    async def work() -> None:
        while (item := next(iterator, None)) is not None:
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
