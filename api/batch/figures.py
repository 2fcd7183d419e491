"""The numbers a batch is summed up with, computed one way for the progress line, the summary
and ``toolq report``: nearest-rank percentiles, and pass rates with their Wilson interval."""

from __future__ import annotations

import math
from collections.abc import Sequence

#: The normal quantile of a two-sided 95% interval.
Z_95 = 1.959963984540054


def nearest_rank(values: Sequence[float], fraction: float) -> float | None:
    """The nearest-rank percentile (``fraction`` 0.5 for the median); None without values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def wilson_interval(passed: int, scored: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a pass rate: unlike the normal approximation it stays inside
    [0, 1] and is not of zero width at 0 or ``scored`` passes."""
    if scored <= 0:
        raise ValueError("a pass rate needs at least one scored item")
    rate = passed / scored
    denominator = 1 + z * z / scored
    centre = (rate + z * z / (2 * scored)) / denominator
    half = z * math.sqrt(rate * (1 - rate) / scored + z * z / (4 * scored * scored)) / denominator
    # Exact at the ends, where rounding would leave 0.9999...
    low = 0.0 if passed == 0 else centre - half
    high = 1.0 if passed == scored else centre + half
    return low, high


def pass_rate_line(passed: int, scored: int) -> str:
    """``Pass rate: 75.0% (3 of 4 scored items; 95% CI 30.1%-95.4%, Wilson)``."""
    low, high = wilson_interval(passed, scored)
    return (
        f"Pass rate: {100 * passed / scored:.1f}% ({passed} of {scored} scored items; "
        f"95% CI {100 * low:.1f}%-{100 * high:.1f}%, Wilson)"
    )
