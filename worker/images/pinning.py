"""A sandbox worker's own queue, which the calls of the runs whose containers it holds come
through, and the sweep it makes when it starts. Wired to Celery's signals in ``worker.tasks``."""

from __future__ import annotations

import logging
from typing import Any

from worker.contract.image_errors import ImageError
from worker.images.here import worker_boxes
from worker.images.owner import pinned_queue, set_worker
from worker.images.sweep import sweep_boxes

log = logging.getLogger(__name__)


def serve_own_queue(node: str, controller: Any) -> None:
    """Before the pool processes fork: the worker is ``node``, and it consumes from its own
    queue too (Celery's documented way to add one)."""
    set_worker(node)
    controller.app.amqp.queues.select_add(pinned_queue(node))


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
