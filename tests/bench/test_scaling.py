"""The scaling case's own arithmetic: its steps, the deploy's concurrency, where its goal is
judged and the broker's ceiling, on figures made up for the purpose."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench.scaling import BARE, TOOLQ, deploy_concurrency, instance_steps
from bench.scaling_report import broker_ceiling, judged_up_to, scaling_case


@pytest.mark.parametrize(
    ("cores", "most", "steps"),
    [
        (1, None, [1]),
        (2, None, [1, 2]),
        (6, None, [1, 2, 4, 6]),
        (32, None, [1, 2, 4, 8, 16, 32]),
        (32, 2, [1, 2]),
    ],
)
def test_steps_double_up_to_the_cores(cores: int, most: int | None, steps: list[int]) -> None:
    assert instance_steps(cores, most) == steps


def test_the_concurrency_is_the_deploys(tmp_path: Path) -> None:
    assert deploy_concurrency() >= 1
    manifest = tmp_path / "worker.yaml"
    manifest.write_text(
        "kind: ConfigMap\n---\nkind: Deployment\nspec:\n  template:\n    spec:\n"
        "      containers:\n        - env:\n            - {name: TOOLQ_CONCURRENCY, value: '6'}\n"
    )
    assert deploy_concurrency(manifest) == 6
    manifest.write_text("kind: Deployment\nspec: {template: {spec: {containers: [{}]}}}\n")
    with pytest.raises(ValueError, match="TOOLQ_CONCURRENCY"):
        deploy_concurrency(manifest)


def step(rate: float, busy: float, redis_ms: float, cores: float = 2.0) -> dict[str, Any]:
    figures = {
        "calls_per_s": rate,
        "redis_main_thread_busy": busy,
        "redis_ms_per_call": redis_ms,
        "cores_busy": cores,
    }
    return {TOOLQ: figures, BARE: {**figures, "calls_per_s": rate / 2}}


CURVE = {
    1: step(500, 0.10, 0.20),
    2: step(950, 0.19, 0.20),
    4: step(1500, 0.30, 0.20),
    8: step(2400, 0.95, 0.40),
}
SPLIT = {"calls_per_s": 500.0, "broker_redis_ms_per_call": 0.12, "results_redis_ms_per_call": 0.08}


def test_the_goal_is_judged_only_where_the_cores_and_redis_allow() -> None:
    # One instance kept 2 cores busy: 16 cores fit 8, but at 8 Redis was saturated.
    case = scaling_case(CURVE, SPLIT, concurrency=4, calls=100, cores=16)
    judged = {c.metric: c.passed for c in case.comparisons if c.goal is not None}
    assert judged == {"calls/s, 2 instances": True, "calls/s, 4 instances": False}
    # 1500 < 0.8 x 4 x 500: the 4 instances miss the goal.
    assert judged_up_to(CURVE, 16) == 8 and judged_up_to(CURVE, 3) == 1
    # On 3 cores nothing beyond one instance is judged, and the note says why.
    small = scaling_case(CURVE, SPLIT, concurrency=4, calls=100, cores=3)
    assert all(c.goal is None for c in small.comparisons)
    assert "not judged" in small.notes[0]


def test_the_ceiling_comes_from_the_busiest_step() -> None:
    ceiling = broker_ceiling(CURVE, TOOLQ)
    assert ceiling["from_instances"] == 8
    assert ceiling["calls_per_s"] == 2500  # 1000 / 0.40 ms
    assert ceiling["instances_at_one_instance_rate"] == 5.0
    split = scaling_case(CURVE, SPLIT, 4, 100, 16).figures["broker_and_results_on_a_redis_each"]
    assert split["ceiling_two_redis_calls_per_s"] == round(1000 / 0.12)
    assert split["ceiling_results_redis_alone_calls_per_s"] == round(1000 / 0.08)


def test_a_tiny_run_without_counted_cpu_claims_no_ceiling() -> None:
    curve = {1: step(50, 0.0, 0.0)}
    case = scaling_case(curve, {**SPLIT, "results_redis_ms_per_call": 0.0}, 4, 5, 2)
    assert case.figures["broker_ceiling"][TOOLQ]["calls_per_s"] is None
    assert any("Too little Redis CPU" in note for note in case.notes)
    assert case.table[2].startswith("| 1 x 4 |")
