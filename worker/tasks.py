"""The one Celery task: hand the request to the executor, which stores and sends the answer."""

from __future__ import annotations

import logging
import os
import socket
from functools import lru_cache
from typing import Any

import redis
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from celery.signals import worker_process_init, worker_ready, worker_shutdown

from worker.app import app
from worker.celery_guard import ValidatedRequest
from worker.executor import Executor
from worker.manifest import Heartbeat, fleet_tool_specs
from worker.protocol import TASK_NAME
from worker.results import ResultStore
from worker.sandbox import SandboxConfig, SandboxError, sweep_orphans
from worker.settings import get_worker_settings

log = logging.getLogger(__name__)
_heartbeat: list[Heartbeat] = []


@lru_cache(maxsize=1)
def executor() -> Executor:
    """One per process, made after the fork so no connection is shared between children."""
    settings = get_worker_settings()
    client = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
    store = ResultStore(client, settings.result_ttl_s)
    name = f"{socket.gethostname()}:{os.getpid()}"
    return Executor(settings, store, name, time_limit=(SoftTimeLimitExceeded,))


class ToolTask(Task):  # type: ignore[misc]
    Request = ValidatedRequest

    def on_failure(
        self, exc: BaseException, task_id: str, args: Any, kwargs: Any, einfo: Any
    ) -> None:
        # Past the hard limit the child is gone; the main process answers in its place.
        if isinstance(exc, TimeLimitExceeded) and args:
            limit = exc.args[0] if exc.args else 0
            executor().store_timeout(args[0], float(limit))


@app.task(  # type: ignore[untyped-decorator]
    name=TASK_NAME,
    bind=True,
    base=ToolTask,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
    # A result store that is down mid-call: try again; the start marker keeps it at-most-once
    # for tools with effects.
    autoretry_for=(redis.ConnectionError, redis.TimeoutError),
    retry_backoff=True,
    max_retries=5,
)
def execute_tool(self: Task, request: Any) -> None:
    delivery = self.request.delivery_info or {}
    pool = delivery.get("routing_key")
    executor().handle(request, pool)


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_process(**_: Any) -> None:
    executor.cache_clear()
    # A new pool process often replaces one that was killed mid-call: end what it left running.
    try:
        found = sweep_orphans(SandboxConfig.from_settings(get_worker_settings()))
    except SandboxError as exc:
        log.warning("cannot sweep orphaned commands: %s", exc)
    else:
        if found:
            log.warning("killed %d command(s) left by a worker process that died", found)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(sender: Any, **_: Any) -> None:
    settings = get_worker_settings()
    pools = [q for q in sender.app.amqp.queues.consume_from if q in ("tools", "sandbox")]
    client = redis.Redis.from_url(settings.redis_url)
    beat = Heartbeat(client, sender.hostname, pools, fleet_tool_specs(settings))
    beat.start()
    _heartbeat.append(beat)
    log.info("toolq worker %s serving pools %s", sender.hostname, pools)


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _goodbye(**_: Any) -> None:
    while _heartbeat:
        _heartbeat.pop().stop()
