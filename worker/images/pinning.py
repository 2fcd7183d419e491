"""A sandbox worker's own queue, which the calls of the runs whose containers it holds come
through, and the sweep it makes when it starts. Wired to Celery's signals in ``worker.tasks``."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import redis

from worker.contract.errors import ImageError
from worker.contract.settings import get_worker_settings
from worker.contract.settings_check import EXIT_BAD_SETTINGS
from worker.exceptions import NodeNameTaken
from worker.images.here import worker_boxes
from worker.images.node_claim import claim_node_name
from worker.images.owner import pinned_queue, set_worker
from worker.images.sweep import sweep_boxes
from worker.sandbox.config import SandboxConfig

log = logging.getLogger(__name__)


def serve_own_queue(node: str, controller: Any) -> None:
    """Before the pool processes fork: the worker is ``node``, and it consumes from its own
    queue too (Celery's documented way to add one). A name another live worker holds stops
    this one, in one line: sharing it would share the queue."""
    _claim_or_exit(node)
    set_worker(node, SandboxConfig.from_settings(get_worker_settings()))
    controller.app.amqp.queues.select_add(pinned_queue(node))


def _claim_or_exit(node: str) -> None:
    client = redis.Redis.from_url(get_worker_settings().redis_url)
    try:
        claim_node_name(client, node)
    except NodeNameTaken as exc:
        print(f"error: {exc}", file=sys.stderr, flush=True)
        os._exit(EXIT_BAD_SETTINGS)
    except redis.RedisError as exc:
        # The broker's own wait decides whether this worker can start; its heartbeat claims
        # the name once the store answers.
        log.warning("cannot check that node name %s is this worker's alone: %s", node, exc)
    finally:
        client.close()


def sweep_now() -> None:
    """End the boxes nobody will end (a worker that died, a workspace removed); nothing where
    this worker cannot run images."""
    try:
        boxes = worker_boxes()
    except ImageError:
        return
    ended = sweep_boxes(boxes)
    if ended:
        log.warning("ended %d container(s) of runs that are over or workers that died", ended)
