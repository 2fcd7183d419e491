"""A worker's task events published a batch at a time.

Celery's consumer buffers the task events it sends (received, started, succeeded or failed) and
publishes what it holds at the next turn of its event loop: under load, one message for nearly
every event, three broker round trips per task, which took about 40% of a busy tools consumer's
CPU. Here the first event buffered schedules the publication ``FLUSH_AFTER_S`` later, so that
one message carries every event of that time; a buffer that reaches Celery's own limit (24
events) is still published at once. Monitors (Flower, ``celery events``) see an event at most
``FLUSH_AFTER_S`` late, and nothing of a call's answer waits for its events.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, bootsteps

#: How long an event may wait for others to travel with it.
FLUSH_AFTER_S = 0.05


class BatchedTaskEvents(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer bootstep that publishes the buffered task events at most every
    ``FLUSH_AFTER_S``. Started again with each event dispatcher (a reconnection makes a new
    one); stopped with a last publication, so that a stopping worker sends what it holds."""

    requires = ("celery.worker.consumer.events:Events",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._scheduled: Any = None

    def start(self, parent: Any) -> None:
        dispatcher = parent.event_dispatcher
        if parent.hub is None or dispatcher is None:
            return  # no event loop: Celery publishes each event as it is sent

        def buffered() -> None:
            # Called in the thread that sent the event (a thread pool's worker thread too), as
            # Celery's own: the loop's ready set is the only thing safe to touch from there.
            parent.hub.call_soon(self._schedule, parent)

        dispatcher.on_send_buffered = buffered

    def _schedule(self, parent: Any) -> None:
        if self._scheduled is None:
            self._scheduled = parent.hub.call_later(FLUSH_AFTER_S, self._flush, parent)

    def _flush(self, parent: Any) -> None:
        self._scheduled = None
        if parent.event_dispatcher is not None:
            parent.event_dispatcher.flush()

    def stop(self, parent: Any) -> None:
        scheduled, self._scheduled = self._scheduled, None
        if scheduled is not None:
            scheduled.cancel()
        # A publication that fails keeps its events for the next dispatcher (Celery's own
        # offline buffer, sent once the connection is back).
        if parent.event_dispatcher is not None:
            parent.event_dispatcher.flush()

    shutdown = stop


def batch_task_events(celery_app: Celery) -> Celery:
    """Make the workers of ``celery_app`` publish their task events in batches."""
    celery_app.steps["consumer"].add(BatchedTaskEvents)
    return celery_app
