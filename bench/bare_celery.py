"""The baseline: a bare Celery no-op task on toolq's broker, with toolq's worker settings.

``celery -A bench.bare_celery worker -Q bare`` runs it; the settings come from the same
``TOOLQ_*`` variables as toolq's workers, only the queue differs so the two never share work.
"""

from __future__ import annotations

from typing import Any

from celery import Celery
from kombu import Queue

from worker.app import celery_config
from worker.contract.settings import WorkerSettings, get_worker_settings

QUEUE = "bare"
NOOP_TASK = "bench.bare_noop"


def noop() -> str:
    return "ok"


def create_app(settings: WorkerSettings) -> Celery:
    """A Celery app with toolq's configuration (prefork, prefetch 1, acks_late, JSON) on kombu's
    own transport: toolq's Redis transport (worker/plumbing/redis_transport.py) is
    toolq's code, not Celery's, so the baseline goes without it."""
    config: dict[str, Any] = {
        **celery_config(settings),
        "broker_transport": None,
        "task_queues": [Queue(QUEUE, routing_key=QUEUE)],
        "task_default_queue": QUEUE,
    }
    bare = Celery("bench-bare")
    bare.config_from_object(config)
    bare.task(name=NOOP_TASK)(noop)
    return bare


app = create_app(get_worker_settings())
