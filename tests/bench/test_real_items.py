"""Case 14 on tiny sizes: its items run as scripted, every run's workspace goes at its end, and its
report has the ratio, the CPU of every process and the tools pool's steps."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.real_items import CALLS_PER_ITEM, QUICK
from bench.real_items_report import KEY, REAL_GOAL, step_costs
from tests.bench.conftest import QUICK_RUN_TIMEOUT_S

pytestmark = [pytest.mark.integration, pytest.mark.timeout(QUICK_RUN_TIMEOUT_S + 60)]


@pytest.fixture
def case(results: Path) -> dict[str, Any]:
    """Case 14 as the quick run of the whole bench reported it."""
    report: dict[str, Any] = json.loads((results / "latest.json").read_text())["cases"][KEY]
    return report


def test_the_ratio_is_judged_against_the_goal(case: dict[str, Any]) -> None:
    rate = case["comparisons"][0]
    assert rate["goal"] == f"ratio ≥ {REAL_GOAL:g}" and isinstance(rate["passed"], bool)
    assert rate["value"] > 0 and rate["baseline"] > 0
    figures = case["figures"]
    assert figures["rounds"] == QUICK.rounds == len(figures["ratios"])
    assert figures["tool_calls_per_round"] == QUICK.items * CALLS_PER_ITEM


def test_every_run_lets_its_workspace_go(case: dict[str, Any]) -> None:
    assert case["figures"]["workspaces_removed_per_round"] == [QUICK.items] * QUICK.rounds
    assert case["figures"]["tool_call_errors_per_round"] == [0] * QUICK.rounds


def test_the_cpu_of_every_process_is_counted(case: dict[str, Any]) -> None:
    toolq = case["figures"]["toolq_cpu_ms_per_tool_call"]
    assert {"orchestrator", "scripted model", "redis"} <= set(toolq)
    for pool in ("tools pool", "sandbox pool"):
        assert {f"{pool} consumer", f"{pool} process 1", f"{pool} process 2"} <= set(toolq)
    assert toolq["orchestrator"] > 0
    bare = case["figures"]["bare_cpu_ms_per_task"]
    assert {"caller", "bare Celery consumer", "bare Celery process 1", "redis"} <= set(bare)


def test_the_steps_of_a_run_are_each_counted(case: dict[str, Any]) -> None:
    steps = case["figures"]["toolq_steps"]
    per_run = steps["probed_functions_per_run"]
    # Each run's workspace is made ready (on each pool process its calls reach) and removed once.
    assert per_run["run end: workspace removed (remove_held)"] == 1
    assert per_run["run start: workspace made ready (uid claim, folders)"] >= 1
    assert per_run["call: Executor.handle (start marker, tool, sealed answer)"] == (
        CALLS_PER_ITEM + 1
    )
    assert any(step.startswith("run start: uid claim") for step in steps["ms_per_run"])
    assert any(step.startswith("each call:") for step in steps["ms_per_tool_call"])


def test_steps_are_split_without_counting_a_nested_one_twice() -> None:
    sums = {
        "call: Executor.handle (start marker, tool, sealed answer)": (10.0, 5),
        "call: CallRunner.run (the tool in its workspace)": (8.0, 5),
        "run start: workspace made ready (uid claim, folders)": (3.0, 1),
        "run start: uid claim": (2.0, 1),
        "run end: workspace removed (remove_held)": (1.0, 1),
    }
    cpu = {"tools pool process 1": 12.0, "tools pool consumer": 4.0}
    steps = step_costs([{"steps": sums, "cpu_s": cpu}], items=1, calls_per_item=4)
    per_run, per_call = steps["ms_per_run"], steps["ms_per_tool_call"]
    assert sum(per_run.values()) == pytest.approx(4000.0)  # start and end, each once
    # The rest of the pool's 16 s, spread over 4 calls: nothing counted twice, nothing lost.
    assert sum(per_call.values()) * 4 + sum(per_run.values()) == pytest.approx(16000.0)
    assert KEY == "real_items"
