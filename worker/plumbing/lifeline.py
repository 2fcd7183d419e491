"""A worker serves or exits.

Its heartbeat says it is live only while its consumer's event loop turns, and a worker whose
consumer has stopped for good ends its process within ``FAILED_STOP_S``, so that whatever
supervises it (compose's ``restart``, Kubernetes, the local stack) starts it again.

Celery reports such a stop as "Unrecoverable error" and then stops the worker gracefully. That
stop waits for the pool, and a pool that cannot finish (a result pipe cut mid-message, a child
that never ends) keeps it waiting for ever: the process lives on and takes no call, its
heartbeat thread still beats, and SIGTERM only asks for the stop already stuck.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from celery import Celery, bootsteps
from celery.apps.worker import Worker
from celery.platforms import EX_FAILURE
from celery.utils.dispatch import Signal

log = logging.getLogger(__name__)

#: How often a running consumer's event loop records that it turns.
TURN_INTERVAL_S = 1.0
#: A loop that has not turned for this long takes no calls: the heartbeat skips its beats, and
#: the worker's key lapses unless the loop turns again (a broker away, a consumer stuck). toolq's
#: workers run calls in pool processes or threads, never in the loop (``-P solo`` would).
STALE_AFTER_S = 5.0
#: How long the stop after a failure may take before the process exits regardless: time for
#: Celery's own clean-up and for calls about to finish. A stop that takes longer is stuck, and
#: each second of it is one in which a supervisor could have started the worker again.
FAILED_STOP_S = 10.0

#: Sent, from a thread of its own, once the worker's consumer has stopped for good (a failure or
#: a cold stop): the worker takes no more calls, whatever the process still does. Receivers get
#: ``exitcode``, the status the process will end with.
consumer_lost = Signal(name="toolq_consumer_lost")


class ConsumerVitals:
    """Whether this process's consumer takes calls: its event loop turned lately, and it has not
    stopped for good."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._turned_at: float | None = None
        self._lost = False
        self._lock = threading.Lock()

    def turned(self) -> None:
        self._turned_at = self._clock()

    def lose(self) -> bool:
        """The consumer stopped for good; True only the first time it is said."""
        with self._lock:
            first, self._lost = not self._lost, True
        return first

    def serving(self) -> bool:
        turned = self._turned_at
        return not self._lost and turned is not None and self._clock() - turned < STALE_AFTER_S


#: This process's consumer (a worker process has one). Celery makes the worker and its
#: bootsteps from their classes, so they cannot be handed an object: they share this one.
VITALS = ConsumerVitals()


class LoopTurns(bootsteps.StartStopStep):  # type: ignore[misc]
    """A consumer bootstep that records each turn of the consumer's event loop, on the loop's own
    timer (it fires only when the loop runs). Started again on each reconnection, once the
    connection and the task consumer are up."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        self._entry: Any = None

    def start(self, parent: Any) -> None:
        VITALS.turned()
        self._entry = parent.timer.call_repeatedly(TURN_INTERVAL_S, VITALS.turned)

    def stop(self, parent: Any) -> None:
        entry, self._entry = self._entry, None
        if entry is not None:
            entry.cancel()

    shutdown = stop


class ServingWorker(Worker):  # type: ignore[misc]
    """Celery's worker, withdrawn from the fleet at once when it stops for a failure (or cold),
    and ended within ``FAILED_STOP_S`` of it, whatever its stop waits for."""

    def stop(self, in_sighandler: bool = False, exitcode: int | str | None = None) -> None:
        # Celery stops with a non-zero status only for a failure: "Unrecoverable error" (any
        # exception out of a bootstep, the consumer's included), or a broker it may not retry.
        if exitcode:
            _lose_consumer(exitcode)
        super().stop(in_sighandler=in_sighandler, exitcode=exitcode)

    def terminate(self, in_sighandler: bool = False) -> None:
        _lose_consumer(self.exitcode or EX_FAILURE)
        super().terminate(in_sighandler=in_sighandler)


def serve_or_exit(celery_app: Celery) -> Celery:
    """Make the workers of ``celery_app`` (``celery -A ... worker``) serve or exit."""
    celery_app.steps["consumer"].add(LoopTurns)
    celery_app.Worker = celery_app.subclass_with_self(ServingWorker)
    return celery_app


def _lose_consumer(exitcode: int | str) -> None:
    if not VITALS.lose():
        return
    # SystemExit("why") stops Celery with a message for its status: the process fails.
    code = exitcode if isinstance(exitcode, int) else EX_FAILURE
    log.error("the worker takes no more calls; it exits within %g s", FAILED_STOP_S)
    # Neither waits for the other, nor for the stop: the receivers talk to a Redis that may be
    # the reason for the failure, and the exit must come however long they take.
    threading.Thread(
        target=_exit_after, args=(FAILED_STOP_S, code), name="toolq-exit", daemon=True
    ).start()
    threading.Thread(
        target=consumer_lost.send,
        kwargs={"sender": None, "exitcode": code},
        name="toolq-consumer-lost",
        daemon=True,
    ).start()


def _exit_after(bound_s: float, exitcode: int) -> None:
    time.sleep(bound_s)
    log.critical("the worker did not stop within %g s: exiting with status %d", bound_s, exitcode)
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()
    # Past a stop that is stuck: no clean-up of Python's can be trusted to return either. The
    # pool's children end with this process (their parent-death signal).
    os._exit(exitcode)
