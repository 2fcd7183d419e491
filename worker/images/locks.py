"""Waiting for a lock file that another process of the host may hold."""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from worker.contract.errors import ImageError


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


@contextlib.contextmanager
def held_lock(path: Path, deadline: float, poll_s: float, image: str, busy: str) -> Iterator[None]:
    """An exclusive lock on the file at ``path`` (made if missing) while the block runs, taken
    by ``deadline``; ``ImageError`` about ``image``, saying ``busy``, when it does not come. A
    lock file removed while this waited (a sweep lets a finished one go) is left for the one
    there now: a lock on a removed file guards nothing."""
    while True:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        if not lock_by(fd, deadline, poll_s):
            os.close(fd)
            raise ImageError(image, busy)
        try:
            if os.path.samestat(os.fstat(fd), os.stat(path)):
                break
        except OSError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        os.close(fd)
