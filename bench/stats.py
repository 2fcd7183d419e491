"""Summaries of samples, and the shape every case reports: figures next to their baseline."""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(samples: list[float], pct: float) -> float:
    """The ``pct`` percentile by linear interpolation between closest ranks."""
    if not samples:
        raise ValueError("no samples")
    ordered = sorted(samples)
    rank = (len(ordered) - 1) * pct / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def summarize(samples_ms: list[float]) -> dict[str, float]:
    """p50/p95/p99, mean, min and max of latencies in milliseconds."""
    return {
        "n": len(samples_ms),
        "p50_ms": round(percentile(samples_ms, 50), 4),
        "p95_ms": round(percentile(samples_ms, 95), 4),
        "p99_ms": round(percentile(samples_ms, 99), 4),
        "mean_ms": round(statistics.fmean(samples_ms), 4),
        "min_ms": round(min(samples_ms), 4),
        "max_ms": round(max(samples_ms), 4),
    }


@dataclass(frozen=True)
class Comparison:
    """One figure of toolq's next to the baseline's, their ratio, and the goal if there is one.

    ``higher_is_better`` says which way the goal points: for a latency the ratio must stay at or
    under ``goal``, for a throughput at or over it. ``goal_on`` names what the goal judges: the
    ratio, toolq's own figure (``"value"``, e.g. megabytes) or the difference to the baseline
    (``"difference"``, e.g. milliseconds added).
    """

    metric: str
    value: float
    baseline: float
    baseline_name: str
    unit: str
    goal: float | None = None
    higher_is_better: bool = False
    goal_on: str = "ratio"

    @classmethod
    def from_seconds(
        cls,
        metric: str,
        seconds: float,
        baseline_seconds: float,
        baseline_name: str,
        *,
        digits: int,
        goal: float | None = None,
    ) -> Comparison:
        """Two durations timed in seconds, compared in milliseconds rounded to ``digits``."""
        return cls(
            metric=metric,
            value=round(seconds * 1000, digits),
            baseline=round(baseline_seconds * 1000, digits),
            baseline_name=baseline_name,
            unit="ms",
            goal=goal,
        )

    @property
    def ratio(self) -> float | None:
        return self.value / self.baseline if self.baseline else None

    @property
    def passed(self) -> bool | None:
        if self.goal is None:
            return None
        judged = {
            "ratio": self.ratio,
            "value": self.value,
            "difference": self.value - self.baseline,
        }[self.goal_on]
        if judged is None:
            return None
        return judged >= self.goal if self.higher_is_better else judged <= self.goal

    def goal_text(self) -> str:
        if self.goal is None:
            return ""
        sign = "≥" if self.higher_is_better else "≤"
        if self.goal_on == "ratio":
            return f"ratio {sign} {self.goal:g}"
        subject = "value" if self.goal_on == "value" else "difference"
        return f"{subject} {sign} {self.goal:g} {self.unit}"

    def as_dict(self) -> dict[str, Any]:
        data = asdict(self)
        ratio = self.ratio
        data["ratio"] = None if ratio is None else round(ratio, 4)
        data["goal"] = self.goal_text() or None
        data["passed"] = self.passed
        return data


@dataclass
class CaseResult:
    """What one case measured: raw figures, comparisons, notes, and samples for the plot."""

    key: str
    title: str
    figures: dict[str, Any] = field(default_factory=dict)
    comparisons: list[Comparison] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    samples_ms: dict[str, list[float]] = field(default_factory=dict)
    #: Markdown lines (a table) shown under the comparisons, and a plot of the case's own.
    table: list[str] = field(default_factory=list)
    image: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "title": self.title,
            "figures": self.figures,
            "comparisons": [c.as_dict() for c in self.comparisons],
            "notes": self.notes,
        }
