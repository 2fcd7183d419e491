"""The bench of the sandbox's start-up paths (``bench.start_paths``): each path runs, taken
away one at a time, and is timed."""

from __future__ import annotations

import os

import pytest

from bench.start_paths import ANY_RUN, BASH, DASH, MADE_NOW, NO_GROUP, POOL, measure
from worker.sandbox import command
from worker.sandbox.cgroup_layout import detect_layout
from worker.sandbox.layers import plan_for
from worker.sandbox.start import ready_pool


def test_every_start_up_path_is_timed_back_to_back_and_after_a_pause() -> None:
    if os.geteuid() != 0 or not detect_layout("auto", "/sys/fs/cgroup").hierarchies:
        pytest.skip("the paths are those of a root worker that makes control groups")
    kept = (ready_pool.READY, ready_pool.EACH_RUN)
    found = measure(calls=2, turns=1)
    assert set(found) == {POOL, ANY_RUN, MADE_NOW, BASH, DASH, NO_GROUP}
    assert all(set(p50) == {"back to back", "paused"} for p50 in found.values())
    assert all(ms > 0 for p50 in found.values() for ms in p50.values())
    # What a path took away is back once it has run.
    assert kept == (ready_pool.READY, ready_pool.EACH_RUN)
    assert vars(command)["plan_for"] is plan_for
