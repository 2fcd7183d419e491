"""Waits of a teardown that end at a bound, and say so when they do: a process stuck in the
kernel, or a thread stuck in a system call, must not hold a call, a worker's exit or a test
for ever; and the polling a teardown waits by."""

from __future__ import annotations

import logging
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Protocol

log = logging.getLogger(__name__)

_FIRST_PAUSE_S = 0.0002
_LONGEST_PAUSE_S = 0.01


class Waitable(Protocol):
    pid: int

    def wait(self, timeout: float | None = None) -> int: ...


def wait_at_most(proc: Waitable, bound_s: float, what: str) -> int | None:
    """``proc``'s exit status once it has ended, waiting at most ``bound_s``; None, with a
    line in the log naming ``what``, when it is still there."""
    try:
        return proc.wait(bound_s)
    except subprocess.TimeoutExpired:
        log.warning(
            "%s (pid %d) has not ended after %.1f s: no longer waiting", what, proc.pid, bound_s
        )
        return None


def join_at_most(thread: threading.Thread, bound_s: float, what: str) -> bool:
    """Whether ``thread`` ended within ``bound_s``; if not, a line in the log names ``what``."""
    thread.join(bound_s)
    if thread.is_alive():
        log.warning("%s has not ended after %.1f s: no longer waiting", what, bound_s)
        return False
    return True


def poll_until(condition: Callable[[], bool], deadline: float) -> bool:
    """Check ``condition`` at growing intervals (the kernel is usually done at once) until it
    holds (True) or ``deadline`` passes (False)."""
    pause = _FIRST_PAUSE_S
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, _LONGEST_PAUSE_S)
    return True
