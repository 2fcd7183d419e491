"""The conversation task, and an agents worker's life: its host made as it starts (a missing
model key stops it there), its heartbeat, its close."""

from __future__ import annotations

import logging
import os
import threading
from typing import Any

import redis
from celery.concurrency import get_implementation
from celery.concurrency.thread import TaskPool as ThreadsPool
from celery.signals import worker_init, worker_ready, worker_shutdown

from api.agents.app import app
from api.agents.host import ConversationHost
from api.agents.messages import CONVERSATION_TASK
from api.exceptions import AgentsWorkerError
from api.settings import get_settings
from worker.contract.wire import AGENTS_QUEUE
from worker.plumbing.heartbeat import Heartbeat
from worker.plumbing.jobs.delivery import JobTask

log = logging.getLogger(__name__)
_hosts: dict[int, ConversationHost] = {}
_hosts_lock = threading.Lock()
_heartbeat: list[Heartbeat] = []


def host() -> ConversationHost:
    """This process's host, made on first use (per process: a forked child makes its own)."""
    with _hosts_lock:
        found = _hosts.get(os.getpid())
        if found is None:
            found = _hosts[os.getpid()] = ConversationHost(get_settings())
        return found


@app.task(name=CONVERSATION_TASK, base=JobTask)  # type: ignore[untyped-decorator]
def run_conversation(request: Any) -> None:
    host().run(request)


def _ours(sender: Any) -> bool:
    """Celery's signals go to every handler in the process: only the agents app's workers."""
    return bool(getattr(getattr(sender, "app", None), "main", None) == app.main)


@worker_init.connect  # type: ignore[untyped-decorator]
def _open(sender: Any, **_: Any) -> None:
    if not _ours(sender):
        return
    try:
        if get_implementation(sender.pool_cls) is not ThreadsPool:
            raise AgentsWorkerError(
                "an agents worker runs on Celery's threads pool (-P threads, the default of "
                f"api.agents.app), not {sender.pool_cls!r}: its conversations share one event loop"
            )
        host()
    except Exception as exc:
        # Celery logs and forgets what a signal handler raises: a worker that cannot run a
        # conversation must not take any, so it stops here, saying why.
        log.critical("the agents worker cannot start: %s", exc)
        raise SystemExit(f"toolq agents worker: {exc}") from exc


@worker_ready.connect  # type: ignore[untyped-decorator]
def _announce(sender: Any, **_: Any) -> None:
    if not _ours(sender):
        return
    client = redis.Redis.from_url(get_settings().redis_url)
    beat = Heartbeat(client, sender.hostname, [AGENTS_QUEUE], [])
    beat.start()
    _heartbeat.append(beat)
    concurrency = sender.controller.concurrency
    log.info("toolq agents worker %s: up to %d conversations at once", sender.hostname, concurrency)


@worker_shutdown.connect  # type: ignore[untyped-decorator]
def _goodbye(sender: Any, **_: Any) -> None:
    if not _ours(sender):
        return
    while _heartbeat:
        _heartbeat.pop().stop()
    with _hosts_lock:
        while _hosts:
            _hosts.popitem()[1].close()
