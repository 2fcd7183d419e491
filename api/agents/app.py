"""The agents workers' Celery app: ``celery -A api.agents.app worker -Q agents`` (or ``toolq worker
--pool agents``) runs conversations, ``TOOLQ_AGENT_CONCURRENCY`` at once per process."""

from __future__ import annotations

from typing import Any

from celery import Celery

from api.settings import OrchestratorSettings, get_settings
from worker.contract.keys import AGENTS_UNACKED_HASH, AGENTS_UNACKED_INDEX, AGENTS_UNACKED_MUTEX
from worker.contract.wire import AGENTS_QUEUE, task_queues
from worker.plumbing.lifeline import serve_or_exit
from worker.plumbing.redis_transport import transport_setting

#: Seconds a conversation's message stays unacknowledged past its time limit before the Redis
#: transport hands it out again (its caller will have sent it again long before).
VISIBILITY_MARGIN_S = 60


def agents_config(settings: OrchestratorSettings) -> dict[str, Any]:
    """Late acknowledgement, and as many conversations per process as TOOLQ_AGENT_CONCURRENCY."""
    broker = settings.effective_broker_url
    config: dict[str, Any] = {
        "broker_url": broker,
        **transport_setting(broker),
        "task_serializer": "json",
        "accept_content": ["json"],
        "task_ignore_result": True,
        # A conversation is acknowledged once answered: one its worker died with is redelivered
        # (a caller that saw the worker die has usually sent it again already; see store.py).
        "task_acks_late": True,
        "task_reject_on_worker_lost": True,
        # Each task is a thread that waits while its conversation runs on the process's event
        # loop (host.py): the threads pool runs as many at once as it has threads, and the
        # prefetch of one per thread takes no more than that from the queue.
        "worker_pool": "threads",
        "worker_concurrency": settings.agent_concurrency,
        "worker_prefetch_multiplier": 1,
        # A conversation outlives a broker blip: its lease (store.py), not the connection, says
        # whether it still runs; the threads pool could not cancel it anyway.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_connection_retry_on_startup": True,
        "task_queues": task_queues(AGENTS_QUEUE),
        "task_default_queue": AGENTS_QUEUE,
        "worker_send_task_events": True,
        "worker_hijack_root_logger": False,
    }
    if broker.startswith(("redis", "rediss")):
        config["broker_transport_options"] = {
            # It must outlast the longest conversation, or one still running would be handed
            # out again; kept apart from the tool pools', whose timeout is much shorter.
            "visibility_timeout": int(settings.conversation_timeout_s) + VISIBILITY_MARGIN_S,
            "unacked_key": AGENTS_UNACKED_HASH,
            "unacked_index_key": AGENTS_UNACKED_INDEX,
            "unacked_mutex_key": AGENTS_UNACKED_MUTEX,
        }
    return config


def create_agents_app(settings: OrchestratorSettings | None = None) -> Celery:
    agents_app = Celery("toolq-agents", include=["api.agents.tasks"])
    agents_app.config_from_object(agents_config(settings or get_settings()))
    # As the tool pools' workers: one whose consumer stops for good exits, to be started again.
    return serve_or_exit(agents_app)


app = create_agents_app()
