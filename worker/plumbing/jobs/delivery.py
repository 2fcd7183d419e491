"""How a job's Celery message is delivered: the same for tool calls and conversations."""

from __future__ import annotations

from celery import Task

from worker.plumbing.celery_guard import ValidatedRequest


class JobTask(Task):  # type: ignore[misc]
    """The base of toolq's Celery tasks: a job delivered at least once, its answer kept by the
    job mechanism (``answers``) rather than Celery's result backend."""

    Request = ValidatedRequest
    # Acknowledged once the job has run, and handed out again if its worker dies mid-way: a
    # second run is harmless, since the first answer stored is the job's.
    acks_late = True
    reject_on_worker_lost = True
    # The answer goes to the job's own store and the caller's reply list; the task's return
    # value is only for task events.
    ignore_result = True
