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

from worker.plumbing.backoff import Backoff

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
#: Redis before 7 reports a write refused inside a script as the script's failure, the refusal's
#: own code in its text (``Error running script (...): @user_script:9: -OOM command not
#: allowed ...``); Redis 7 answers with the refusal's code, which redis-py raises as its class.
_CODES_IN_SCRIPTS: tuple[tuple[str, type[redis.ResponseError]], ...] = (
    ("-OOM ", OutOfMemoryError),
    ("-READONLY ", ReadOnlyError),
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
        except redis.RedisError as raised:
            exc = as_refusal(raised)
            if not isinstance(exc, REFUSALS):
                raise
            failures += 1
            left = (deadline or 0.0) - clock()
            if left <= 0:
                if exc is raised:
                    raise
                raise exc from raised
            if failures == 1:
                log.warning(
                    "the result store refused %s (%s: %s); trying again for up to %.1f s",
                    what,
                    type(exc).__name__,
                    exc,
                    left,
                )
            pause(min(PAUSES.delay(failures), left))


def as_refusal(exc: redis.RedisError) -> redis.RedisError:
    """``exc``; a write refused inside a script on Redis before 7 as the class Redis 7 gives."""
    if type(exc) is redis.ResponseError:
        text = str(exc)
        for code, refusal in _CODES_IN_SCRIPTS:
            if code in text:
                return refusal(text[text.index(code) + len(code) :])
    return exc
