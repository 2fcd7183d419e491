"""The tool calls of the last minutes, kept in memory: their rate, errors and latency by tool.

Prometheus counters say how many calls there were since the process started; the viewer's fleet
page wants what happened lately, at a glance, without a Prometheus server: so each replica keeps
the calls it saw answered in the last ``window_s`` seconds (at most ``max_calls`` of them).

Calls the orchestrator refused (a tool the fleet does not know, or one switched off) ran no tool:
they are counted apart, never in a tool's latency, failures or the call rate.
"""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

#: Ten minutes of calls; at most this many, whatever the rate, so memory stays bounded.
WINDOW_S = 600.0
MAX_CALLS = 100_000


@dataclass(frozen=True, slots=True)
class CallSample:
    at: float
    tool: str
    ok: bool
    seconds: float
    #: Answered without running the tool: unknown to the fleet, or switched off.
    refused: bool = False


@dataclass(frozen=True, slots=True)
class RateBucket:
    """Calls answered in ``[start, start + width)``."""

    start: float
    width: float
    calls: int
    errors: int

    @property
    def per_second(self) -> float:
        return self.calls / self.width

    @property
    def error_rate(self) -> float | None:
        return self.errors / self.calls if self.calls else None


@dataclass(frozen=True, slots=True)
class ToolLatency:
    tool: str
    #: Calls that ran the tool, and those of them that failed.
    calls: int
    errors: int
    #: None when every call was refused.
    p50_ms: float | None
    p95_ms: float | None
    #: Calls refused before any tool ran (unknown or switched-off tool).
    refused: int = 0


class RecentCalls:
    """A sliding window of answered calls; safe to add to from any thread."""

    def __init__(
        self,
        window_s: float = WINDOW_S,
        max_calls: int = MAX_CALLS,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.window_s = window_s
        self._calls: deque[CallSample] = deque(maxlen=max_calls)
        self._clock = clock
        self._lock = threading.Lock()

    def add(self, tool: str, ok: bool, seconds: float, *, refused: bool = False) -> None:
        with self._lock:
            self._calls.append(CallSample(self._clock(), tool, ok, seconds, refused))

    def samples(self) -> list[CallSample]:
        """The calls inside the window, oldest first."""
        since = self._clock() - self.window_s
        with self._lock:
            while self._calls and self._calls[0].at < since:
                self._calls.popleft()
            return list(self._calls)

    def rates(
        self, bucket_s: float = 10.0, samples: list[CallSample] | None = None
    ) -> list[RateBucket]:
        """Calls and errors per ``bucket_s`` over the whole window, oldest bucket first (of
        ``samples``, when the caller took them already)."""
        now = self._clock()
        count = math.ceil(self.window_s / bucket_s)
        first = now - count * bucket_s
        calls = [0] * count
        errors = [0] * count
        for sample in self.samples() if samples is None else samples:
            slot = min(int((sample.at - first) // bucket_s), count - 1)
            if slot >= 0 and not sample.refused:
                calls[slot] += 1
                errors[slot] += not sample.ok
        return [
            RateBucket(first + n * bucket_s, bucket_s, calls[n], errors[n]) for n in range(count)
        ]

    def latency_by_tool(self, samples: list[CallSample] | None = None) -> list[ToolLatency]:
        """p50 and p95 of each tool's calls that ran in the window, and its refused calls apart,
        busiest tool first (of ``samples``, when the caller took them already)."""
        by_tool: dict[str, list[CallSample]] = {}
        for sample in self.samples() if samples is None else samples:
            by_tool.setdefault(sample.tool, []).append(sample)
        rows = []
        for tool, samples in by_tool.items():
            ran = [s for s in samples if not s.refused]
            ordered = sorted(s.seconds * 1000 for s in ran)
            rows.append(
                ToolLatency(
                    tool=tool,
                    calls=len(ran),
                    errors=sum(not s.ok for s in ran),
                    p50_ms=quantile(ordered, 0.50) if ordered else None,
                    p95_ms=quantile(ordered, 0.95) if ordered else None,
                    refused=len(samples) - len(ran),
                )
            )
        return sorted(rows, key=lambda row: (-row.calls, -row.refused, row.tool))


def quantile(ordered: list[float], q: float) -> float:
    """The ``q`` quantile of sorted values, interpolating between the two nearest ranks."""
    if not ordered:
        raise ValueError("no values")
    rank = (len(ordered) - 1) * q
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)
