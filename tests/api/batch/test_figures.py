"""The numbers batches are summed up with: percentiles and pass rates with their interval."""

from __future__ import annotations

import pytest

from api.batch.figures import nearest_rank, pass_rate_line, wilson_interval


@pytest.mark.parametrize(
    ("passed", "scored", "low", "high"),
    [
        # The p where |passed/scored - p| = 1.96 * sqrt(p * (1 - p) / scored), found by
        # bisection apart from the closed form under test.
        (3, 4, 0.300642, 0.954413),
        (0, 10, 0.0, 0.277533),
        (10, 10, 0.722467, 1.0),
        (1, 2, 0.094531, 0.905469),
        (81, 100, 0.722212, 0.874852),
    ],
)
def test_the_wilson_interval_matches_reference_values(
    passed: int, scored: int, low: float, high: float
) -> None:
    found = wilson_interval(passed, scored)
    assert found == pytest.approx((low, high), abs=1e-6)


def test_a_pass_rate_needs_a_scored_item() -> None:
    with pytest.raises(ValueError, match="at least one scored item"):
        wilson_interval(0, 0)


def test_the_pass_rate_line_gives_the_rate_the_counts_and_the_interval() -> None:
    assert pass_rate_line(3, 4) == (
        "Pass rate: 75.0% (3 of 4 scored items; 95% CI 30.1%-95.4%, Wilson)"
    )


def test_percentiles_are_nearest_rank() -> None:
    assert nearest_rank([], 0.5) is None
    assert nearest_rank([5.0, 1.0, 3.0, 2.0], 0.5) == 2.0
    assert nearest_rank(list(range(1, 101)), 0.95) == 95
    assert nearest_rank([7], 0.95) == 7
