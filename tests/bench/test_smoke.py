"""``make bench``'s harness on tiny sizes: every case runs and every result file is written."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from bench.sandbox_parts import EXEC, HANDOVER, IN_PROCESS, PAUSED, TMPFS
from bench.scaling import deploy_concurrency
from tests.bench.conftest import QUICK_RUN_TIMEOUT_S

pytestmark = [pytest.mark.integration, pytest.mark.timeout(QUICK_RUN_TIMEOUT_S + 60)]

CASES = {
    "round_trip",
    "throughput",
    "conversations",
    "run_bash",
    "big_output",
    "search_text",
    "tasks",
    "viewer",
    "run_bash_cgroups",
    "agents_pool",
    "scaling",
    "images",
    "sessions",
    "batch_throughput",
    "real_items",
}


def test_every_case_reports_its_baseline_and_ratio(results: Path) -> None:
    data = json.loads((results / "latest.json").read_text())
    assert set(data["cases"]) == CASES
    for key, case in data["cases"].items():
        if key == "images" and not case["comparisons"]:
            # Containers need root and their packages; without them the case says so.
            assert any(note.startswith("not measured") for note in case["notes"])
            continue
        assert case["comparisons"], f"{key} compares nothing"
        for comparison in case["comparisons"]:
            assert comparison["baseline_name"]
            assert comparison["value"] >= 0 and comparison["baseline"] > 0
            assert comparison["ratio"] == pytest.approx(
                comparison["value"] / comparison["baseline"], rel=1e-3, abs=1e-4
            )


def test_each_goal_is_judged_pass_or_fail(results: Path) -> None:
    goals = json.loads((results / "latest.json").read_text())["goals"]
    judged = {goal["metric"]: goal["passed"] for goal in goals}
    assert {
        "round trip p50, worker ready",
        "round trip p99, worker ready",
        "worker peak RSS growth",
        "first page of 2,000 lines (median, from the command's start)",
    } <= set(judged)
    assert all(isinstance(passed, bool) for passed in judged.values())


def test_the_agents_pool_case_ran_every_arrangement(results: Path) -> None:
    case = json.loads((results / "latest.json").read_text())["cases"]["agents_pool"]
    runs = case["figures"]["by_arrangement"]
    assert set(runs) == {
        "one orchestrator process",
        "1 agents worker process",
        "2 agents worker processes",
    }
    assert {run["conversations"] for run in runs.values()} == {10}
    assert runs["2 agents worker processes"]["cpu_s_by_process"]["agents workers"] > 0
    assert runs["one orchestrator process"]["processes"] == 1


def test_the_conversations_all_ran_to_their_answer(results: Path) -> None:
    figures = json.loads((results / "latest.json").read_text())["cases"]["conversations"]["figures"]
    runs = [value for key, value in figures.items() if key.startswith("at_")]
    assert len(runs) == 2
    for run in runs:
        assert run["answered"] == run["conversations"]
        assert run["tool_calls"] == run["conversations"] * 6 and run["tool_call_errors"] == 0


def test_markdown_names_the_machine_and_every_case(results: Path) -> None:
    page = (results / "latest.md").read_text()
    lines = page.splitlines()
    assert lines[0] == "# toolq benchmarks"
    assert any(line.startswith("- Machine: ") and "cores" in line for line in lines[:5])
    assert any("Celery" in line and "Redis server" in line for line in lines[:5])
    assert sum(line.startswith("## ") for line in lines) == len(CASES) + 2  # goals, notes
    assert "| **pass** |" in page or "| **FAIL** |" in page


def test_the_plots_are_pngs(results: Path) -> None:
    for name in ("latency.png", "scaling.png"):
        assert (results / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_scaling_case_ran_each_step_on_both_systems(results: Path) -> None:
    figures = json.loads((results / "latest.json").read_text())["cases"]["scaling"]["figures"]
    steps = figures["by_instances"]
    assert "1" in steps and len(steps) == min(2, len(os.sched_getaffinity(0)))
    for step in steps.values():
        for system in ("toolq", "bare Celery"):
            assert step[system]["calls_per_s"] > 0
            assert 0 <= step[system]["redis_main_thread_busy"] <= 1.5
    split = figures["broker_and_results_on_a_redis_each"]
    assert split["calls_per_s"] > 0
    assert f"| 1 x {deploy_concurrency()} |" in (results / "latest.md").read_text()


def test_the_parts_of_run_bash_are_timed_or_say_why_not(results: Path) -> None:
    figures = json.loads((results / "latest.json").read_text())["cases"]["run_bash"]["figures"]
    parts, missing = figures["parts_p50_ms"], figures["parts_unavailable"]
    if IN_PROCESS not in missing:
        assert {IN_PROCESS, PAUSED} <= set(parts)
        assert any(name.startswith(HANDOVER) for name in parts)
    for name in (EXEC, TMPFS):
        assert name in parts or name in missing
    assert all(value >= 0 for value in parts.values())


def test_the_model_clients_own_cost_is_measured_beside_aiohttp(results: Path) -> None:
    figures = json.loads((results / "latest.json").read_text())["cases"]["conversations"]["figures"]
    client = figures["model client"]
    largest = max(value["conversations"] for key, value in figures.items() if key.startswith("at_"))
    assert client["requests"] == largest * 4  # as many as the large run asked the model
    assert client["openai_cpu_ms_per_request"] > 0 < client["aiohttp_cpu_ms_per_request"]
    assert client["model_requests_retried"] == 0


def test_a_session_in_a_container_is_set_beside_an_exec_into_it(results: Path) -> None:
    images = json.loads((results / "latest.json").read_text())["cases"]["images"]
    if "runc" not in images["figures"]:
        pytest.skip(f"runc was not measured: {images['notes']}")
    runc = images["figures"]["runc"]
    assert runc["bash_session_true"]["n"] == runc["exec_true"]["n"] > 0
    assert runc["bash_session_first_call_ms"] > 0
    metrics = {comparison["metric"]: comparison for comparison in images["comparisons"]}
    pair = metrics["runc: bash_session 'true' typed into the container's shell (p50)"]
    assert pair["baseline_name"] == "runc: exec 'true' into the same container"
