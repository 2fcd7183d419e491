"""Waiting for a lock file that another process of the host may hold."""

from __future__ import annotations

import fcntl
import time


def lock_by(fd: int, deadline: float, poll_s: float) -> bool:
    """Take an exclusive lock on ``fd``, trying every ``poll_s`` until ``deadline`` (of
    ``time.monotonic``); whether it was taken."""
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(poll_s)
