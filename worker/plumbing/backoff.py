"""Exponential backoff: how long to wait before trying again after a run of failures (the
workers' result writes, the dispatcher's sends, the model client's requests)."""

from __future__ import annotations

import random
from dataclasses import dataclass

#: Past this many doublings every delay is the cap anyway; without a bound, a failure that
#: lasts long enough would overflow the float (2.0 ** 1024).
_MAX_DOUBLINGS = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """``first_s`` after the first failure, doubling with each failure in a row, at most
    ``cap_s``; up to ``jitter`` of each delay is added at random, so that many callers that
    failed together do not all come back at the same instant."""

    first_s: float
    cap_s: float
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if min(self.first_s, self.cap_s, self.jitter) < 0:
            raise ValueError("backoff delays and jitter cannot be negative")

    def delay(self, failures: int) -> float:
        """Seconds to wait after ``failures`` failed tries in a row (1 for the first)."""
        doublings = min(max(failures - 1, 0), _MAX_DOUBLINGS)
        delay = min(self.cap_s, self.first_s * 2.0**doublings)
        if self.jitter:
            delay *= 1 + self.jitter * random.random()
        return delay
