"""A Redis that refuses for a while: which errors say so, and trying again until a deadline.

A store at ``maxmemory`` with ``noeviction`` refuses every write (and, in a transaction, every
command) until memory is freed; a replica promoted late refuses writes as read-only; a restart
or a network blink refuses connections. Each lasts seconds. A worker with an answer in hand
tries again with growing pauses for as long as the call's caller waits for that answer.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TypeVar

import redis
from redis.exceptions import OutOfMemoryError, ReadOnlyError

from worker.contract.runtime.backoff import Backoff

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Writes refused by a server that answers: out of memory (``noeviction``), or read-only.
REFUSED_WRITES: tuple[type[redis.RedisError], ...] = (OutOfMemoryError, ReadOnlyError)
#: Everything a store says while it is away or refusing for a while (a server still loading its
#: data after a restart raises ``BusyLoadingError``, a ``ConnectionError``).
REFUSALS: tuple[type[redis.RedisError], ...] = (
    redis.ConnectionError,
    redis.TimeoutError,
    *REFUSED_WRITES,
)
#: Short at first (a blink is over in milliseconds), then at most a second apart, so that an
#: answer goes out soon after the store takes writes again; jitter keeps the worker processes
#: that were refused together from all coming back at the same instant.
PAUSES = Backoff(first_s=0.05, cap_s=1.0, jitter=0.5)


def until_deadline(
    attempt: Callable[[], T],
    deadline: float | None,
    what: str,
    clock: Callable[[], float] = time.time,
    pause: Callable[[float], None] = time.sleep,
) -> T:
    """``attempt()``, tried again while the store refuses it, until ``deadline`` (epoch
    seconds; ``None``: one try). Past the deadline nobody waits for what it writes: the last
    refusal is raised."""
    failures = 0
    while True:
        try:
            return attempt()
        except REFUSALS as exc:
            failures += 1
            left = (deadline or 0.0) - clock()
            if left <= 0:
                raise
            if failures == 1:
                log.warning(
                    "the result store refused %s (%s: %s); trying again for up to %.1f s",
                    what,
                    type(exc).__name__,
                    exc,
                    left,
                )
            pause(min(PAUSES.delay(failures), left))
