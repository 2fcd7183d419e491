"""Backoff: the pause after a run of failures, for the dispatcher and the model client."""

from __future__ import annotations

import pytest

from worker.plumbing.backoff import Backoff


def test_the_pause_doubles_from_the_first_up_to_the_cap() -> None:
    backoff = Backoff(first_s=0.1, cap_s=2.0)

    assert [backoff.delay(n) for n in range(1, 8)] == pytest.approx(
        [0.1, 0.2, 0.4, 0.8, 1.6, 2.0, 2.0]
    )


def test_a_long_outage_stays_at_the_cap() -> None:
    # Past 1024 doublings the float itself would overflow.
    assert Backoff(first_s=0.1, cap_s=2.0).delay(100_000) == 2.0


def test_jitter_only_adds_up_to_its_fraction() -> None:
    backoff = Backoff(first_s=1.0, cap_s=8.0, jitter=0.5)

    delays = [backoff.delay(2) for _ in range(200)]

    assert all(2.0 <= delay <= 3.0 for delay in delays)
    assert len(set(delays)) > 1


def test_negative_delays_are_refused() -> None:
    with pytest.raises(ValueError, match="cannot be negative"):
        Backoff(first_s=-1, cap_s=2.0)
