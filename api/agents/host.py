"""An agents worker process's conversations: all on one event loop, with one model client and one
dispatcher, each under a lease that says it still runs.

Celery's ``threads`` pool gives each conversation task a thread; the thread hands its
conversation to the process's loop (a thread of its own) and waits for it. The conversations
then cost what they cost in ``toolq batch``: coroutines, not a thread's work each.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError
from redis.exceptions import RedisError

from api.agents.live_run import run_live
from api.agents.messages import (
    LEASE_RENEW_S,
    LEASE_TTL_S,
    ConversationRequest,
    ConversationResult,
)
from api.agents.store import ConversationStore, store_client
from api.batch.items import BatchItem
from api.batch.record import BatchLine
from api.batch.runner import failed_record, process_name, run_item
from api.calls.dispatch import Dispatcher
from api.calls.fleet import CachedFleet
from api.model.client import ChatModel
from api.process.logs import log_context
from api.settings import OrchestratorSettings
from api.state.cancels import watch_cancels
from api.state.run_end import RunEndLine
from api.state.runs import RunStore

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class _Running:
    holder: str
    task: asyncio.Task[None]
    #: Set when someone asks to cancel it: only a run of the HTTP API can be.
    cancel: asyncio.Event | None = None


class ConversationHost:
    """``host.run(message)`` from any thread runs that conversation here and returns once it is
    answered (or was not this worker's to run)."""

    def __init__(self, settings: OrchestratorSettings) -> None:
        self._settings = settings
        self.name = process_name()
        self._running: dict[str, _Running] = {}
        #: Conversations stopped here because their lease was lost: they run elsewhere now.
        self._lost: set[str] = set()
        self._redis = store_client(settings.redis_url)
        self._store = ConversationStore(self._redis, settings.result_ttl_s)
        #: Where a run of the HTTP API keeps its events and transcript.
        self._runs = RunStore(self._redis, retention_s=settings.result_ttl_s)
        self._closing = False
        self._fleet = CachedFleet(settings.redis_url)
        self._dispatcher = Dispatcher(settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="toolq-conversations", daemon=True
        )
        self._thread.start()
        try:
            # A missing OPENAI_API_KEY stops the worker here, before it takes a conversation.
            self._model, self._chores = self._call(self._start()).result()
        except BaseException:
            self._loop.call_soon_threadsafe(self._loop.stop)
            raise

    def run(self, message: Any) -> None:
        """The conversation ``message`` asks for, to its answer; from a Celery task's thread."""
        self._call(self._converse(message)).result()

    def close(self, timeout_s: float = 10.0) -> None:
        """Cancel what still runs, close the clients, stop the loop."""
        if self._loop.is_closed():
            return
        with contextlib.suppress(Exception):
            self._call(self._stop()).result(timeout_s)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout_s)
        if not self._thread.is_alive():
            self._loop.close()

    @property
    def running(self) -> int:
        return len(self._running)

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop)

    async def _start(self) -> tuple[ChatModel, list[asyncio.Task[None]]]:
        # In the loop: the model client's connection pool belongs to it.
        model = ChatModel.from_env(self._settings)
        await self._dispatcher.start()
        cancels = watch_cancels(
            self._runs,
            lambda: [cid for cid, running in self._running.items() if running.cancel is not None],
            self._cancel_run,
            closing=lambda: self._closing,
            poll_s=LEASE_RENEW_S,
        )
        return model, [
            asyncio.create_task(self._renew_leases(), name="toolq-leases"),
            asyncio.create_task(cancels, name="toolq-cancels"),
        ]

    async def _stop(self) -> None:
        self._closing = True
        for chore in self._chores:
            chore.cancel()
        for running in list(self._running.values()):
            running.task.cancel()
        await asyncio.gather(
            *self._chores, *(r.task for r in self._running.values()), return_exceptions=True
        )
        await self._dispatcher.close()
        await self._model.aclose()
        await self._redis.aclose()

    async def _converse(self, message: Any) -> None:
        try:
            request = ConversationRequest.model_validate(message)
        except ValidationError as exc:
            log.error("dropping a conversation message that is not a request: %s", exc)
            return
        cid = request.conversation_id
        with log_context(run_id=cid):
            claim = await self._store.claim(request, self.name)
            if claim.stored is not None:
                log.info("conversation %s was answered already; sending the answer again", cid)
                await self._store.reply(request.reply_to, claim.stored)
                return
            if claim.holder is None:
                log.info("not running conversation %s (%s: %s)", cid, claim.why, claim.other)
                return
            task = asyncio.current_task()
            assert task is not None
            cancel = asyncio.Event() if request.run is not None else None
            self._running[cid] = _Running(claim.holder, task, cancel)
            try:
                record = await self._record(request, claim.attempt, cancel)
            except asyncio.CancelledError:
                if cid not in self._lost:
                    raise
                return  # its caller runs it again elsewhere: nothing to answer from here
            finally:
                self._running.pop(cid, None)
                self._lost.discard(cid)
            result = ConversationResult(
                conversation_id=cid,
                task_id=request.task_id,
                attempt=claim.attempt,
                worker=self.name,
                record=record,
            )
            if not await self._store.finish(request, claim.holder, result):
                log.info("conversation %s was sent again meanwhile: this answer is dropped", cid)

    def _cancel_run(self, run_id: str) -> None:
        running = self._running.get(run_id)
        if running is not None and running.cancel is not None and not running.cancel.is_set():
            log.info("cancelling run %s on request", run_id)
            running.cancel.set()

    async def _record(
        self, request: ConversationRequest, attempt: int, cancel: asyncio.Event | None
    ) -> BatchLine | RunEndLine:
        cid = request.conversation_id
        timeout_s = min(request.timeout_s, self._settings.conversation_timeout_s)
        if request.run is not None and cancel is not None:
            return await run_live(
                cid,
                request.run.prompt,
                request.run.options,
                store=self._runs,
                model=self._model,
                dispatcher=self._dispatcher,
                fleet=await self._fleet.get(),
                settings=self._settings,
                timeout_s=timeout_s,
                attempt=attempt,
                orchestrator=self.name,
                cancelled=cancel,
            )
        raw = request.item or {}
        try:
            item = BatchItem.model_validate(raw)
        except ValidationError as exc:
            model = raw.get("model") or request.default_model or self._settings.model
            item = BatchItem.model_construct(id=str(raw.get("id", cid)), prompt="")
            error = f"the agents worker cannot read this item: {exc}"
            return failed_record(
                item, cid, str(model), error, attempts=attempt, ran_on=self.name, waited_s=0.0
            )
        return await run_item(
            item,
            model=self._model,
            dispatcher=self._dispatcher,
            fleet=await self._fleet.get(),
            settings=self._settings,
            run_id=cid,
            default_model=request.default_model,
            timeout_s=timeout_s,
            attempt=attempt,
        )

    async def _renew_leases(self) -> None:
        """Renew the leases of the conversations running here. A conversation whose lease was
        lost is being run again elsewhere: it stops here. So do all of them once the leases
        could not be renewed for their whole life (Redis out of reach, this host cut off)."""
        renewed_at = time.monotonic()
        while True:
            await asyncio.sleep(LEASE_RENEW_S)
            held = {cid: running.holder for cid, running in self._running.items()}
            try:
                # Bounded: on a host cut off, a command waits on TCP for minutes.
                async with asyncio.timeout(LEASE_RENEW_S):
                    lost = await self._store.renew(held)
            except (RedisError, OSError, TimeoutError) as exc:
                if time.monotonic() - renewed_at < LEASE_TTL_S:
                    log.warning("cannot renew conversation leases: %r", exc)
                    continue
                lost = list(held)
                log.error("leases not renewed in %d s: stopping %d", LEASE_TTL_S, len(lost))
            else:
                renewed_at = time.monotonic()
            for cid in lost:
                running = self._running.get(cid)
                if running is not None and running.holder == held[cid]:
                    log.warning("conversation %s lost its lease: it runs elsewhere now", cid)
                    self._lost.add(cid)
                    running.task.cancel()
