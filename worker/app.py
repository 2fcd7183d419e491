"""The Celery app: ``celery -A worker.app worker -Q tools`` (or ``-Q sandbox``) runs a pool."""

from __future__ import annotations

from typing import Any

from celery import Celery

from worker.contract.settings import WorkerSettings, get_worker_settings
from worker.contract.settings_check import checked_worker_settings, exit_on_bad_settings
from worker.contract.wire import POOLS, task_queues
from worker.plumbing.lifeline import serve_or_exit
from worker.plumbing.redis_transport import transport_setting
from worker.plumbing.task_events import batch_task_events


def celery_config(settings: WorkerSettings) -> dict[str, Any]:
    """WorkerSettings for at-least-once delivery that toolq makes safe (see worker/executor.py)."""
    broker = settings.effective_broker_url
    config: dict[str, Any] = {
        "broker_url": broker,
        **transport_setting(broker),
        "result_backend": settings.redis_url,
        # JSON only: a pickled message is refused before anything is deserialised.
        "task_serializer": "json",
        "result_serializer": "json",
        "accept_content": ["json"],
        "result_accept_content": ["json"],
        # Acknowledge after the call, requeue if the worker child dies, take one at a time.
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "worker_cancel_long_running_tasks_on_connection_loss": True,
        "broker_connection_retry_on_startup": True,
        "result_expires": settings.result_ttl_s,
        "task_queues": task_queues(*POOLS),
        "task_default_queue": "tools",
        # Flower and `celery events` need these; they cost a message per task state.
        "worker_send_task_events": True,
        "worker_hijack_root_logger": False,
    }
    if broker.startswith(("redis", "rediss")):
        # An unacknowledged message is redelivered after this long: it must exceed the longest
        # call, or a call still running would be started a second time elsewhere.
        config["broker_transport_options"] = {
            "visibility_timeout": int(settings.hard_limit_s) + 60,
        }
    if settings.concurrency:
        config["worker_concurrency"] = settings.concurrency
    return config


def create_celery_app(settings: WorkerSettings | None = None) -> Celery:
    celery_app = Celery("toolq", include=["worker.tasks"])
    celery_app.config_from_object(celery_config(settings or get_worker_settings()))
    # A worker whose consumer stops for good exits (a supervisor starts it again), and its
    # heartbeat says live only while its consumer takes calls: never a live worker that is deaf.
    # Its task events travel a batch to a message: one per event cost a busy consumer dearly.
    return batch_task_events(serve_or_exit(celery_app))


# Checked before Celery starts anything: a misspelt variable or a URL toolq cannot use stops
# `celery -A worker.app worker` (and flower) in a line naming it, not a default or a traceback.
app = create_celery_app(exit_on_bad_settings(checked_worker_settings))
