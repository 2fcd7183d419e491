"""The orchestrator's own Celery app: a producer of tool calls and conversations, with no worker
code in it.

It speaks the same messages as the workers' app (JSON only, one queue per pool) but never
imports it, so sending a call builds no task registry and loads no tool.
"""

from __future__ import annotations

from typing import Any

from celery import Celery

from worker.contract.settings import FleetSettings
from worker.contract.wire import AGENTS_QUEUE, POOLS, task_queues
from worker.plumbing.redis_transport import transport_setting


def producer_config(settings: FleetSettings) -> dict[str, Any]:
    return {
        "broker_url": settings.effective_broker_url,
        **transport_setting(settings.effective_broker_url),
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_queues": task_queues(*POOLS, AGENTS_QUEUE),
        "task_default_queue": POOLS[0],
        # A task-sent event for every call: monitors (Flower, `celery events`) see calls while
        # they wait in the queue, not only once a worker takes them. It goes out in the same
        # round trip as the call, a batch's events in one message (see api/calls/publishing.py).
        "task_send_sent_event": True,
    }


def producer_app(settings: FleetSettings) -> Celery:
    """A Celery app that only sends: the dispatcher's, the conversation client's, and ``toolq
    status``'s for queue depths."""
    app = Celery("toolq-orchestrator", set_as_current=False)
    app.config_from_object(producer_config(settings))
    return app
