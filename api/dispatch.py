"""The caller side: send a tool call to the pool that serves it, await the answer from asyncio.

Answers come back through one Redis list per dispatcher, drained by one reader task, so a
thousand calls in flight cost a thousand futures, not a thousand threads or connections.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import redis.asyncio as aioredis
from celery import Celery
from redis.exceptions import RedisError

from worker import keys
from worker.app import create_app
from worker.manifest import ToolSpec
from worker.protocol import TASK_NAME, ErrorKind, ToolCallRequest, ToolCallResult
from worker.settings import Settings
from worker.tools.context import ToolContextSnapshot

log = logging.getLogger(__name__)
_DRAIN_BATCH = 512


class Dispatcher:
    """Sends ``ToolCallRequest``s as Celery tasks and resolves their results."""

    def __init__(self, settings: Settings, *, celery_app: Celery | None = None) -> None:
        self._settings = settings
        self._app = celery_app or create_app(settings)
        self._redis = aioredis.Redis.from_url(settings.redis_url, health_check_interval=30)
        self.id = uuid.uuid4().hex
        self.reply_key = keys.reply(self.id)
        self._pending: dict[str, asyncio.Future[ToolCallResult]] = {}
        # Kombu's producer is not thread-safe and publishing blocks: one thread owns it, whatever
        # the number of calls in flight.
        self._sender = ThreadPoolExecutor(max_workers=1, thread_name_prefix="toolq-send")
        self._reader: asyncio.Task[None] | None = None
        self._closing = False

    @property
    def redis(self) -> aioredis.Redis:
        return self._redis

    @property
    def in_flight(self) -> int:
        return len(self._pending)

    async def start(self) -> None:
        if self._reader is None:
            self._reader = asyncio.create_task(self._read_replies(), name="toolq-replies")

    async def close(self) -> None:
        self._closing = True
        if self._reader is not None:
            # A blocking BLPOP does not answer a cancel promptly in redis.asyncio; closing its
            # connection does, and the reader then sees it is closing.
            with contextlib.suppress(RedisError, OSError):
                await self._redis.connection_pool.disconnect(inuse_connections=True)
            with contextlib.suppress(TimeoutError, asyncio.CancelledError):
                await asyncio.wait_for(self._reader, 2)
            self._reader = None
        self._sender.shutdown(wait=False, cancel_futures=True)
        await self._redis.aclose()

    async def __aenter__(self) -> Dispatcher:
        await self.start()
        return self

    async def __aexit__(self, *_: object) -> None:
        await self.close()

    def build_request(
        self,
        spec: ToolSpec,
        *,
        tool_call_id: str,
        run_id: str,
        arguments: str | dict[str, Any],
        context: ToolContextSnapshot | None = None,
        timeout_ms: int | None = None,
    ) -> ToolCallRequest:
        """A request whose deadline follows the tool's limit, clamped to the fleet's maximum."""
        limit = timeout_ms or _argument_timeout(spec, arguments) or spec.default_timeout_ms
        limit = min(max(limit, 1), self._settings.max_timeout_ms)
        wait_s = limit / 1000 + self._settings.hard_limit_grace_s + self._settings.reply_margin_s
        return ToolCallRequest(
            tool_call_id=tool_call_id,
            run_id=run_id,
            tool=spec.name,
            arguments=arguments,
            context=context or ToolContextSnapshot(),
            timeout_ms=limit,
            deadline=time.time() + wait_s,
            reply_to=self.reply_key,
        )

    async def call(self, request: ToolCallRequest, pool: str) -> ToolCallResult:
        """Send one call and wait for its answer until its deadline; never raises for failures."""
        if self._reader is None:
            await self.start()
        future: asyncio.Future[ToolCallResult] = asyncio.get_running_loop().create_future()
        self._pending[request.tool_call_id] = future
        sent_at = time.monotonic()
        try:
            try:
                await asyncio.get_running_loop().run_in_executor(
                    self._sender, self._publish, request, pool
                )
            except Exception as exc:
                return _failure(
                    request,
                    "broker_unavailable",
                    f"Error: the call to {request.tool} could not be sent to the {pool!r} queue: "
                    f"{type(exc).__name__}: {exc}",
                )
            try:
                return await asyncio.wait_for(
                    asyncio.shield(future), max(request.deadline - time.time(), 0.01)
                )
            except TimeoutError:
                waited = time.monotonic() - sent_at
                return await self._no_answer(request, pool, waited)
        finally:
            self._pending.pop(request.tool_call_id, None)

    def _publish(self, request: ToolCallRequest, pool: str) -> None:
        soft = request.timeout_ms / 1000
        self._app.send_task(
            TASK_NAME,
            args=[request.model_dump(mode="json")],
            task_id=request.tool_call_id,
            queue=pool,
            routing_key=pool,
            # Answers come through toolq's reply list: without this, Celery would subscribe to
            # its own result channel for every call.
            ignore_result=True,
            soft_time_limit=soft,
            time_limit=soft + self._settings.hard_limit_grace_s,
            retry=True,
            retry_policy={"max_retries": 2, "interval_start": 0.2, "interval_step": 0.5},
        )

    async def _read_replies(self) -> None:
        delay = 0.1
        while not self._closing:
            try:
                item = await self._redis.blpop([self.reply_key], timeout=1)
                if item is None:
                    continue
                self._deliver(item[1])
                # Drain what else has arrived in one round trip, but only when another call is
                # waiting (the one just answered is still listed): a lone call would pay for an
                # empty LPOP every time.
                if len(self._pending) > 1:
                    more: list[bytes] = await self._redis.lpop(  # type: ignore[assignment]
                        self.reply_key, _DRAIN_BATCH
                    )
                    for raw in more or []:
                        self._deliver(raw)
                delay = 0.1
            except (RedisError, OSError) as exc:
                if self._closing:
                    return
                # The result store restarted or the network blinked: keep trying; calls still
                # waiting fall back to their deadline and to the stored result.
                log.warning("reply reader: %s; retrying in %.1fs", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 2.0)

    def _deliver(self, raw: bytes | str) -> None:
        try:
            result = ToolCallResult.model_validate_json(raw)
        except ValueError:
            log.error("dropping a malformed reply: %.200r", raw)
            return
        future = self._pending.get(result.tool_call_id)
        if future is not None and not future.done():
            future.set_result(result)
        # Anything else is a late answer to a call its caller gave up on: dropped.

    async def _no_answer(
        self, request: ToolCallRequest, pool: str, waited: float
    ) -> ToolCallResult:
        """Say why nothing came back: no worker, a worker that died, or the store unreachable."""
        try:
            stored = await self._redis.get(keys.result(request.tool_call_id))
            if stored:
                return ToolCallResult.model_validate_json(stored)
            started_by = await self._redis.get(keys.started(request.tool_call_id))
            workers = [k async for k in self._redis.scan_iter(keys.worker_heartbeats(pool))]
        except (RedisError, OSError) as exc:
            why = f"the broker/result store is unreachable ({exc})"
        else:
            if started_by:
                who = started_by.decode() if isinstance(started_by, bytes) else started_by
                why = f"worker {who} started it but never answered (it may have died)"
            elif not workers:
                # Heartbeats are refreshed every few seconds: right after a broker restart live
                # workers have none yet, so say both.
                why = (
                    f"no worker is serving the {pool!r} queue (none has announced itself: none "
                    "runs, or the broker restarted moments ago)"
                )
            else:
                why = f"none of the {len(workers)} live {pool!r} workers took it in time"
        return _failure(
            request,
            "no_answer",
            f"Error: no answer for {request.tool} after {waited:.1f} s: {why}.",
        )


def _argument_timeout(spec: ToolSpec, arguments: str | dict[str, Any]) -> int | None:
    """The call's own limit when the tool takes one (run_bash's timeout), plus time to report."""
    if not spec.timeout_argument:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    value = arguments.get(spec.timeout_argument) if isinstance(arguments, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value + 1000
    return None


def _failure(request: ToolCallRequest, kind: ErrorKind, message: str) -> ToolCallResult:
    return ToolCallResult(
        tool_call_id=request.tool_call_id,
        tool=request.tool,
        output=message,
        is_error=True,
        error_kind=kind,
    )
