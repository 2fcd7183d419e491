"""A run of the HTTP API on an agents worker: its events and transcript go to the run's record
as they would from the replica, and its end comes back to the replica as a small record (the
replica records the end, so that its metrics and the run's lifecycle stay in one place).

A cancel request reaches the agents worker on the same channel the replicas listen to; the
conversation stops and answers ``cancelled``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Coroutine
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from api.batch.runner import time_limit_error
from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.conversation.agent import Agent, AgentOptions
from api.conversation.events import TextDiscarded, event_to_dict
from api.exceptions import ModelError
from api.model.client import ChatModel
from api.settings import OrchestratorSettings
from api.state.run_end import RunEnd, RunEndLine, RunOutcome
from api.state.run_stream import stream_into_run
from api.state.runs import CANCELLED_ERROR, RunStore

log = logging.getLogger(__name__)


async def run_live(
    run_id: str,
    prompt: str,
    options: dict[str, Any],
    *,
    store: RunStore,
    model: ChatModel,
    dispatcher: Dispatcher,
    fleet: Fleet,
    settings: OrchestratorSettings,
    timeout_s: float,
    attempt: int,
    orchestrator: str,
    cancelled: asyncio.Event,
) -> RunEndLine:
    """Run the conversation into the run's record until it ends, ``timeout_s`` passes or
    ``cancelled`` is set; its end as a ``RunEnd`` line. Raises only ``CancelledError``."""
    try:
        agent_options = AgentOptions.model_validate(options)
    except ValidationError as exc:
        unreadable = f"the agents worker cannot read the run's options: {exc}"
        end = RunEnd(status="failed", error=unreadable, attempts=attempt, orchestrator=orchestrator)
        return end.line()
    if attempt > 1:  # its followers saw an earlier run's text, which this one replaces
        again = f"the agents worker running it stopped; it runs again from the start ({attempt})"
        await _keep(store.add_event(run_id, event_to_dict(TextDiscarded(again))), run_id)
    agent = Agent(model, agent_options, dispatcher=dispatcher, fleet=fleet, settings=settings)
    outcome: RunOutcome
    answer: str | None
    error: str | None
    try:
        outcome, answer, error = await _converse(
            stream_into_run(store, run_id, agent, prompt), cancelled, timeout_s
        )
    except ModelError as exc:
        outcome, answer, error = "failed", None, f"the model API failed: {exc}"
    except Exception as exc:  # a bug must cost this run, not the worker's other conversations
        log.exception("run %s failed", run_id)
        outcome, answer, error = "failed", None, f"{type(exc).__name__}: {exc}"
    finally:
        await agent.close()
    transcript = agent.transcript()
    # The whole conversation, a round cut short included: the last word on the record.
    await _keep(store.save_transcript(run_id, transcript, final=True), run_id)
    return RunEnd(
        status=outcome,
        answer=answer,
        stop_reason=agent.stop_reason if outcome == "succeeded" else None,
        error=error,
        tool_calls=transcript["tool_calls"],
        attempts=attempt,
        orchestrator=orchestrator,
    ).line()


async def _converse(
    conversation: Coroutine[Any, Any, str | None], cancelled: asyncio.Event, timeout_s: float
) -> tuple[RunOutcome, str | None, str | None]:
    """The conversation to its end, its time limit or a cancel request: outcome, answer, error."""
    running = asyncio.create_task(conversation)
    stop = asyncio.create_task(cancelled.wait())
    try:
        done, _ = await asyncio.wait(
            {running, stop}, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
    finally:
        stop.cancel()
        if not running.done():
            running.cancel()
            # Waited for, not awaited: a cancellation of this task meanwhile still propagates.
            await asyncio.wait({running})
    if running in done:
        return "succeeded", running.result(), None
    if stop in done:
        return "cancelled", None, CANCELLED_ERROR
    return "failed", None, time_limit_error(timeout_s)


async def _keep(write: Coroutine[Any, Any, Any], run_id: str) -> None:
    """A write to the run's record that the run's outcome does not wait on: Redis out of reach
    costs the followers that event, not the answer."""
    try:
        await write
    except (RedisError, OSError) as exc:
        log.warning("run %s: could not write to its record: %s", run_id, exc)
