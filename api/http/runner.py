"""Executes runs and batches and records their progress in Redis.

While an agents worker is live, a run's conversation and a batch's items go to the agents pool
(``api/agents/``): an agents worker writes a run's events and transcript, and this replica
records its end. Otherwise every run is an asyncio task driving an ``Agent`` in the API process;
all of them share one ``Dispatcher`` (one reply reader for every call in flight), one
``ChatModel`` and a briefly cached view of the fleet.
Cancellation requests reach the replica that executes a run (and the agents worker running it)
through a Redis pub/sub channel, with a periodic look at the runs' cancel flags for messages
missed while disconnected (``api/state/cancels.py``).

A task is cancelled again and again until it says it is winding down: on Python 3.11 a
cancellation that arrives just as an ``asyncio.wait_for`` completes is lost, and redis-py awaits
through ``wait_for`` on every command.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from redis.exceptions import RedisError

from api.agents.client import ConversationClient
from api.batch.items import BatchItem
from api.batch.record import BatchRecord
from api.batch.runner import process_name, run_item, run_items
from api.batch.tag import batch_run_id, batch_tag
from api.calls.dispatch import Dispatcher
from api.calls.fleet import CachedFleet, Fleet, load_fleet
from api.conversation.agent import Agent, AgentOptions
from api.conversation.placement import AgentsPool, place
from api.exceptions import ImageUnavailable, ModelError, NoAgentsError
from api.http.metrics import ApiMetrics, RunObserver
from api.model.client import ChatModel
from api.process.logs import log_context
from api.settings import OrchestratorSettings
from api.state.batches import BatchStatus
from api.state.cancels import watch_cancels
from api.state.run_end import RunEnd
from api.state.run_stream import stream_into_run
from api.state.runs import CANCELLED_ERROR
from api.state.store import ApiStore

log = logging.getLogger(__name__)

SHUTDOWN_ERROR = "the API server shut down before this ended; start it again"
#: How long a shutting-down replica gives its runs to record that they were stopped.
CLOSE_TIMEOUT_S = 10.0
#: Attempts to record a run's end when Redis is briefly unreachable.
FINISH_ATTEMPTS = 5
#: How often a task that has not yet taken its cancellation is cancelled again.
RECANCEL_S = 0.05

#: What to do once a run or batch has ended, however it ended (give back its tenant's places).
OnEnd = Callable[[], Coroutine[Any, Any, None]]


@dataclass(frozen=True, slots=True)
class BatchSubmission:
    """A batch the routes hand over to be executed, its record already made."""

    batch_id: str
    items: Sequence[BatchItem]
    concurrency: int
    default_model: str | None
    #: What the workers call each item's workspace (given its run_id): the tenant's own name of it.
    workspace_of: Callable[[str], str]
    on_end: OnEnd


class RunExecutor(Protocol):
    """What the HTTP routes need from whatever executes runs and batches."""

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    async def fleet(self) -> Fleet: ...

    def submit_run(
        self, run_id: str, prompt: str, options: AgentOptions, on_end: OnEnd
    ) -> None: ...

    def submit_batch(self, batch: BatchSubmission) -> None: ...


RunExecutorFactory = Callable[[ApiStore, ApiMetrics, str], RunExecutor]


class AgentExecutor:
    """Runs conversations on the fleet; owns (and closes) the dispatcher and the model client."""

    def __init__(
        self,
        settings: OrchestratorSettings,
        store: ApiStore,
        metrics: ApiMetrics,
        model: ChatModel | None,
        *,
        replica: str,
        dispatcher: Dispatcher | None = None,
        fleet_loader: Callable[[str], Fleet] = load_fleet,
        conversations: ConversationClient | None = None,
        cancel_poll_s: float = 2.0,
    ) -> None:
        self._settings = settings
        self._store = store
        self._metrics = metrics
        self._model = model
        self._replica = replica
        self._dispatcher = dispatcher or Dispatcher(settings)
        self._known_fleet: Fleet | None = None
        # Started on first use: only once an agents worker is live.
        self._conversations = conversations or ConversationClient(settings)
        self._cancel_poll_s = cancel_poll_s
        self._runs: dict[str, asyncio.Task[None]] = {}
        self._batches: dict[str, asyncio.Task[None]] = {}
        self._cancel_requested: set[str] = set()
        #: Runs and batches that took their cancellation and are recording their end.
        self._winding_down: set[str] = set()
        self._stoppers: set[asyncio.Task[None]] = set()
        #: What runs and batches that ended are doing about it (``OnEnd``).
        self._enders: set[asyncio.Task[None]] = set()
        self._closing = False
        self._watcher: asyncio.Task[None] | None = None
        self._fleet = CachedFleet(settings.redis_url, load=fleet_loader)

    async def start(self) -> None:
        await self._dispatcher.start()
        watching = watch_cancels(
            self._store,
            lambda: list(self._runs),
            self._cancel_here,
            closing=lambda: self._closing,
            poll_s=self._cancel_poll_s,
        )
        self._watcher = asyncio.create_task(watching, name="toolq-cancels")

    async def close(self) -> None:
        """Stop every run and batch of this replica (recorded as failed), then the clients."""
        self._closing = True
        if self._runs or self._batches:
            log.warning(
                "replica %s stopping: %d runs and %d batches in flight will be marked failed",
                self._replica,
                len(self._runs),
                len(self._batches),
            )
        work = [*self._runs.items(), *self._batches.items()]
        if self._watcher is not None:
            work.append(("cancel watcher", self._watcher))
        await asyncio.gather(*(self._stop(key, task) for key, task in work))
        await asyncio.gather(*self._enders, return_exceptions=True)
        await self._conversations.close()
        await self._dispatcher.close()
        if self._model is not None:
            await self._model.aclose()

    async def fleet(self) -> Fleet:
        fleet = await self._fleet.get()
        if fleet is not self._known_fleet:  # the cache hands out the same view for a while
            self._metrics.know_tools(fleet.tools)
            self._known_fleet = fleet
        return fleet

    def _on_agents_pool(self, fleet: Fleet) -> bool:
        """A conversation goes to the agents pool while ``fleet`` has a live agents worker; if
        the pool is gone by the time it is sent, it runs here after all."""
        return place(self._settings, agents_pool=AgentsPool.WHEN_LIVE, fleet=fleet).on_agents_pool

    def _chat_model(self) -> ChatModel:
        """The model client; a server without one refuses runs and batches before they start."""
        if self._model is None:
            raise ModelError("this server has no model API configured")
        return self._model

    # -- runs ----------------------------------------------------------------------------------

    def submit_run(self, run_id: str, prompt: str, options: AgentOptions, on_end: OnEnd) -> None:
        task = asyncio.create_task(self._execute_run(run_id, prompt, options), name=run_id)
        self._runs[run_id] = task
        task.add_done_callback(lambda _: self._runs.pop(run_id, None))
        self._when_ended(task, on_end)

    def _when_ended(self, task: asyncio.Task[None], on_end: OnEnd) -> None:
        """``on_end`` once ``task`` is done, in a task of its own: cancelling a run that is
        winding down cannot cancel it."""

        def ended(_: asyncio.Task[None]) -> None:
            ender = asyncio.create_task(on_end(), name=f"{task.get_name()}-ended")
            self._enders.add(ender)
            ender.add_done_callback(self._enders.discard)

        task.add_done_callback(ended)

    async def _execute_run(self, run_id: str, prompt: str, options: AgentOptions) -> None:
        observer = RunObserver(self._metrics)
        agent: Agent | None = None
        remote = False
        with log_context(run_id=run_id):
            try:
                if not await self._store.mark_running(run_id):
                    return  # cancelled before it started
                if await self._store.cancels_requested([run_id]):
                    await self._finish(run_id, RunEnd(status="cancelled", error=CANCELLED_ERROR))
                    return
                fleet = await self.fleet()
                if self._on_agents_pool(fleet):
                    remote = True
                    if await self._execute_remotely(run_id, prompt, options):
                        return
                    remote = False
                agent = Agent(
                    self._chat_model(),
                    options,
                    dispatcher=self._dispatcher,
                    fleet=fleet,
                    settings=self._settings,
                )
                agent.observers.append(observer)
                answer = await stream_into_run(self._store, run_id, agent, prompt)
                await self._finish(
                    run_id,
                    RunEnd(status="succeeded", answer=answer, stop_reason=agent.stop_reason),
                    agent,
                )
            except asyncio.CancelledError:
                self._winding_down.add(run_id)
                if self._closing and run_id not in self._cancel_requested:
                    if remote:  # the agents worker stops it too, rather than run it for nobody
                        with contextlib.suppress(RedisError, OSError):
                            await self._store.request_cancel(run_id)
                    await self._finish(run_id, RunEnd(status="failed", error=SHUTDOWN_ERROR), agent)
                else:
                    await self._finish(
                        run_id, RunEnd(status="cancelled", error=CANCELLED_ERROR), agent
                    )
            except ModelError as exc:
                await self._finish(
                    run_id, RunEnd(status="failed", error=f"the model API failed: {exc}"), agent
                )
            except ImageUnavailable as exc:  # one line naming the image and the cause
                await self._finish(run_id, RunEnd(status="failed", error=str(exc)), agent)
            except Exception as exc:
                log.exception("run %s failed", run_id)
                await self._finish(
                    run_id, RunEnd(status="failed", error=f"{type(exc).__name__}: {exc}"), agent
                )
            finally:
                observer.close()
                self._cancel_requested.discard(run_id)
                self._winding_down.discard(run_id)
                if agent is not None:
                    await agent.close()

    async def _execute_remotely(self, run_id: str, prompt: str, options: AgentOptions) -> bool:
        """Run it on the agents pool, which writes its events and transcript; record its end
        here. False when the pool is gone: the run goes on in this replica."""
        try:
            ended = await self._conversations.run_live(run_id, prompt, options)
        except NoAgentsError:
            log.warning("the agents pool is gone: run %s runs here", run_id)
            return False
        end = RunEnd.model_validate(ended)
        self._metrics.record_tool_calls(end.tool_calls)
        await self._finish(run_id, end)
        return True

    async def _finish(self, run_id: str, ending: RunEnd, agent: Agent | None = None) -> None:
        """Record the run's end; ``agent`` is the one that ran it here, if it ran here."""
        if agent is not None:
            ending = ending.model_copy(
                update={"transcript": agent.transcript(), "orchestrator": process_name()}
            )
        for attempt in range(1, FINISH_ATTEMPTS + 1):
            try:
                ended = await self._store.finish_run(run_id, ending)
            except (RedisError, OSError) as exc:
                if attempt == FINISH_ATTEMPTS:
                    log.error("could not record the end of run %s: %s", run_id, exc)
                    return
                await asyncio.sleep(0.2 * 2**attempt)
            else:
                if ended:
                    self._metrics.record_run(ending.status)
                return

    # -- batches -------------------------------------------------------------------------------

    def submit_batch(self, batch: BatchSubmission) -> None:
        batch_id = batch.batch_id
        task = asyncio.create_task(self._execute_batch(batch), name=batch_id)
        self._batches[batch_id] = task
        task.add_done_callback(lambda _: self._batches.pop(batch_id, None))
        self._when_ended(task, batch.on_end)

    async def _execute_batch(self, batch: BatchSubmission) -> None:
        batch_id, items, default_model = batch.batch_id, batch.items, batch.default_model
        tag = batch_tag(batch_id)

        async def run_one(item: BatchItem) -> dict[str, Any]:
            await self._store.batch_item_started(batch_id)
            run_id = batch.workspace_of(batch_run_id(tag, item.id))
            fleet = await self.fleet()
            if self._on_agents_pool(fleet):
                try:
                    return await self._conversations.run(
                        item, run_id=run_id, default_model=default_model
                    )
                except NoAgentsError:
                    log.warning("the agents pool is gone: batch %s runs %s here", batch_id, run_id)
            return await run_item(
                item,
                model=self._chat_model(),
                dispatcher=self._dispatcher,
                fleet=fleet,
                settings=self._settings,
                run_id=run_id,
                default_model=default_model,
                timeout_s=self._settings.conversation_timeout_s,
            )

        async def record(result: dict[str, Any]) -> None:
            line = BatchRecord.read(result)
            await self._store.add_batch_result(batch_id, result)
            self._metrics.record_tool_calls(line.tool_calls)
            self._metrics.record_batch_item(line.status == "ok")

        status: BatchStatus = "succeeded"
        error: str | None = None
        try:
            if not await self._store.mark_batch_running(batch_id):
                return
            await run_items(
                items,
                concurrency=max(1, min(batch.concurrency, len(items))),
                runner=run_one,
                on_result=record,
            )
        except asyncio.CancelledError:
            self._winding_down.add(batch_id)
            status, error = "failed", SHUTDOWN_ERROR
        except Exception as exc:
            log.exception("batch %s failed", batch_id)
            status, error = "failed", f"{type(exc).__name__}: {exc}"
        try:
            await self._store.finish_batch(batch_id, status, error=error)
        except (RedisError, OSError) as exc:
            log.error("could not record the end of batch %s: %s", batch_id, exc)
        finally:
            self._winding_down.discard(batch_id)

    # -- cancellation --------------------------------------------------------------------------

    async def _stop(self, key: str, task: asyncio.Task[None]) -> None:
        """Cancel ``task`` until it takes it, then give it time to record how it ended."""
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while not task.done() and key not in self._winding_down:
            if time.monotonic() > deadline:
                log.error("%s did not stop in %.0f s", key, CLOSE_TIMEOUT_S)
                return
            task.cancel()
            await asyncio.wait([task], timeout=RECANCEL_S)
        await asyncio.wait([task], timeout=max(deadline - time.monotonic(), 0.01))

    def _cancel_here(self, run_id: str) -> None:
        task = self._runs.get(run_id)
        if task is None or task.done() or run_id in self._cancel_requested:
            return
        log.info("cancelling run %s on request", run_id)
        self._cancel_requested.add(run_id)
        stopper = asyncio.create_task(self._stop(run_id, task), name=f"cancel-{run_id}")
        self._stoppers.add(stopper)
        stopper.add_done_callback(self._stoppers.discard)
