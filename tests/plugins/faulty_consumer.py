"""toolq's worker app with a fault to inject: ``celery -A tests.plugins.faulty_consumer worker``.

SIGUSR2 makes the consumer's event loop raise, as a corrupt message from a pool process or a
broker connection closed under kombu does: Celery stops the worker with "Unrecoverable error".
With ``FAULTY_CONSUMER_STOP_HANGS=1`` the consumer's stop then never returns, as a pool that waits
for a child that will not finish.
"""

from __future__ import annotations

import os
import signal
import threading
from typing import Any

from celery import bootsteps

from worker.app import app

STOP_HANGS_VARIABLE = "FAULTY_CONSUMER_STOP_HANGS"


class InjectedFault(bootsteps.StartStopStep):  # type: ignore[misc]
    requires = ("celery.worker.consumer.tasks:Tasks",)

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        super().__init__(parent, **kwargs)
        # The signal handler only writes to a pipe: the loop reads it and raises, so the error
        # comes out of a loop callback, where the real ones do.
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        signal.signal(signal.SIGUSR2, lambda *_: os.write(self._write, b"!"))

    def start(self, parent: Any) -> None:
        parent.hub.add_reader(self._read, self._raise)

    def _raise(self) -> None:
        os.read(self._read, 64)
        raise RuntimeError("injected unrecoverable error")

    def stop(self, parent: Any) -> None:
        if os.environ.get(STOP_HANGS_VARIABLE) == "1":
            threading.Event().wait()  # bound: the worker's shutdown is killed by the test


app.steps["consumer"].add(InjectedFault)
