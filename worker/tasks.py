"""The one Celery task: hand the request to the executor, which stores and sends the answer.

What Celery's monitoring (task events, Flower, ``celery events``) shows of a call is its
outcome in a few words, never its arguments or output: ``ok 3.2 ms`` as the task's return
value, or, for a call answered with an error, a FAILURE whose exception reads ``error timeout
after 30012 ms``. The failure is raised only after the answer is stored and sent, as an
exception listed in the task's ``throws``: Celery logs it in one line without a traceback and
acknowledges the message; it is never retried, so delivery stays at most once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from functools import lru_cache
from typing import Any

import redis
from celery import Task
from celery.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from celery.signals import (
    after_setup_logger,
    celeryd_after_setup,
    worker_init,
    worker_process_init,
    worker_ready,
    worker_shutdown,
)

import worker.inspect_views  # noqa: F401  (Celery inspect shows each call's summary only)
from worker.app import app
from worker.contract.errors import FleetSecretError
from worker.contract.fleet_secret import fleet_secret
from worker.contract.settings import get_worker_settings
from worker.contract.settings_check import EXIT_BAD_SETTINGS
from worker.contract.wire import POOLS, TASK_NAME, Pool, ToolCallResult
from worker.exceptions import McpUnavailableError, NotRunHere, ToolCallFailed
from worker.executor import Executor
from worker.housekeeping import Housekeeping, worker_limits
from worker.images.owner import pool_of_queue
from worker.images.pinning import serve_own_queue
from worker.manifest import fleet_tool_specs
from worker.mcp.hosting import start_hosting, stop_hosting
from worker.mcp.hosting import unavailable as hosted_unavailable
from worker.plumbing.heartbeat import Heartbeat
from worker.plumbing.jobs.delivery import JobTask
from worker.plumbing.lifeline import VITALS, consumer_lost
from worker.plumbing.log_context import show_ids
from worker.results import ResultStore
from worker.sandbox import SandboxConfig, SandboxError, sweep_orphans
from worker.sandbox.hardening import hardening_refusal
from worker.sandbox.host_registry import HostRegistry

log = logging.getLogger(__name__)
#: The exit status of a sandbox worker that refuses to start because its runs would share a uid.
EXIT_CANNOT_ISOLATE = 3
_heartbeat: list[Heartbeat] = []
_housekeeping: list[Housekeeping] = []


@lru_cache(maxsize=1)
def executor() -> Executor:
    """One per process, made after the fork so no connection is shared between children."""
    settings = get_worker_settings()
    client = redis.Redis.from_url(settings.redis_url, health_check_interval=30)
    store = ResultStore(client, settings.result_ttl_s, fleet_secret(settings.fleet_secret_file))
    name = f"{socket.gethostname()}:{os.getpid()}"
    return Executor(
        settings, store, name, time_limit=(SoftTimeLimitExceeded,), pools=served_pools(app)
    )


def served_pools(celery_app: Any) -> list[Pool]:
    """The pools this worker consumes from (its -Q), known before the pool processes fork."""
    return [q for q in celery_app.amqp.queues.consume_from if q in POOLS]


def outcome_summary(result: ToolCallResult) -> str:
    """``ok 3.2 ms``, ``error timeout after 30012 ms``: what monitors show of a call."""
    ms = result.duration_ms
    took = f"{ms:.1f} ms" if ms < 100 else f"{ms:.0f} ms"
    return (
        f"error {result.error_kind or 'tool_error'} after {took}"
        if result.is_error
        else f"ok {took}"
    )


class ToolTask(JobTask):
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
    throws=(ToolCallFailed,),
    # A result store that is down mid-call: try again; the start marker keeps it at-most-once
    # for tools with effects.
    autoretry_for=(redis.ConnectionError, redis.TimeoutError),
    retry_backoff=True,
    max_retries=5,
)
def execute_tool(self: Task, request: Any) -> str:
    delivery = self.request.delivery_info or {}
    # A worker's own queue (``worker.images.pinning``) is its sandbox pool's.
    pool = pool_of_queue(delivery.get("routing_key"))
    try:
        result = executor().handle(request, pool, self.request.hostname)
    except NotRunHere as exc:
        # A spare message of a call that runs, or ran, elsewhere: nothing to answer here.
        return f"not run: {exc}"
    summary = outcome_summary(result)
    if result.is_error:
        raise ToolCallFailed(summary)
    return summary


@after_setup_logger.connect  # type: ignore[untyped-decorator]
def _log_call_ids(logger: logging.Logger, **_: Any) -> None:
    # Celery's log format knows nothing of calls: a tool's traceback must say whose call it was.
    show_ids(logger)


@celeryd_after_setup.connect  # type: ignore[untyped-decorator]
def _own_queue(sender: str, instance: Any, **_: Any) -> None:
    # A sandbox worker holds the containers of runs with an image: their calls come to it
    # alone, through a queue of its own.
    if "sandbox" in served_pools(instance.app):
        serve_own_queue(sender, instance)


@worker_init.connect  # type: ignore[untyped-decorator]
def _refuse_without_the_fleet_secret(**_: Any) -> None:
    # Read before the first call: a worker that cannot seal answers says why in one line and
    # exits, rather than answer every call with an error or with answers nobody takes.
    try:
        fleet_secret(get_worker_settings().fleet_secret_file)
    except FleetSecretError as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_BAD_SETTINGS)


@worker_init.connect  # type: ignore[untyped-decorator]
def _refuse_to_share_runs(sender: Any, **_: Any) -> None:
    # Fail closed: a sandbox worker that cannot keep runs apart (they would share one uid, or
    # the host's /tmp without the sysctls that guard it) says so and exits, before it takes a
    # call, unless the operator allowed it.
    if "sandbox" not in served_pools(sender.app):
        return
    config = SandboxConfig.from_settings(get_worker_settings())
    refusal = (
        config.sharing_refusal()
        or config.volume_refusal()
        or hardening_refusal(config)
        or HostRegistry(config.host_state).refusal()
    )
    if refusal is not None:
        print(f"error: {refusal}", file=sys.stderr, flush=True)
        os._exit(EXIT_CANNOT_ISOLATE)


@worker_process_init.connect  # type: ignore[untyped-decorator]
def _fresh_process(**_: Any) -> None:
    executor.cache_clear()
    settings = get_worker_settings()
    # This process's own MCP servers, started now in the background so that they are up, or
    # known to have failed, by the first call.
    try:
        start_hosting(settings, served_pools(app))
    except McpUnavailableError as exc:
        log.error("%s", exc)
    # A new pool process often replaces one that was killed mid-call: end what it left running.
    try:
        found = sweep_orphans(SandboxConfig.from_settings(settings))
    except SandboxError as exc:
        log.warning("cannot sweep orphaned commands: %s", exc)
    else:
        if found:
            log.warning("killed %d command(s) left by a worker process that died", found)


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(sender: Any, **_: Any) -> None:
    settings = get_worker_settings()
    pools = served_pools(sender.app)
    specs = fleet_tool_specs(settings, pools)
    # The tool list is all this process needs of the MCP servers: the pool processes keep
    # their own to run the calls.
    unavailable = hosted_unavailable()
    stop_hosting()
    for tools, why in unavailable.items():
        log.error("not serving %s: %s", tools, why)
    client = redis.Redis.from_url(settings.redis_url)
    limits = worker_limits(settings, pools)
    beat = Heartbeat(
        client, sender.hostname, pools, specs, unavailable, limits, serving=VITALS.serving
    )
    beat.start()
    _heartbeat.append(beat)
    chores = Housekeeping(settings, pools)
    chores.start()
    _housekeeping.append(chores)
    log.info("toolq worker %s serving pools %s", sender.hostname, pools)


@worker_shutdown.connect  # type: ignore[untyped-decorator]
@consumer_lost.connect  # type: ignore[untyped-decorator]
def _goodbye(**_: Any) -> None:
    # A consumer lost for good withdraws the worker at once, from a thread of its own, while
    # the main thread may be stopping it: each heartbeat and chore is stopped by one of them.
    for started in (_heartbeat, _housekeeping):
        with contextlib.suppress(IndexError):  # popped, each at most once, until none is left
            while True:
                started.pop().stop()
