"""Case 14's figures from its rounds: the rates and their ratio, the CPU of every process per
call, and the tools pool's CPU by step of a run (``bench.step_probes``)."""

from __future__ import annotations

import os
import statistics
from typing import Any

from bench import step_probes as sp
from bench.stats import CaseResult, Comparison

#: toolq's tool calls per second over bare Celery's no-op tasks per second, same run.
REAL_GOAL = 0.7
KEY = "real_items"


def _per_call_ms(rounds: list[dict[str, Any]], calls: int) -> dict[str, float]:
    """Each process's CPU per call in milliseconds, over every round."""
    names = list(dict.fromkeys(name for r in rounds for name in r["cpu_s"]))
    total = calls * len(rounds)
    return {
        name: round(sum(r["cpu_s"].get(name, 0.0) for r in rounds) * 1000 / total, 3)
        for name in names
    }


def _summed_steps(rounds: list[dict[str, Any]]) -> dict[str, tuple[float, int]]:
    summed: dict[str, tuple[float, int]] = {}
    for r in rounds:
        for label, (seconds, calls) in r["steps"].items():
            s, n = summed.get(label, (0.0, 0))
            summed[label] = (s + seconds, n + calls)
    return summed


def step_costs(rounds: list[dict[str, Any]], items: int, calls_per_item: int) -> dict[str, Any]:
    """The tools pool's CPU by step: per run for a run's start and end, per tool call for the
    rest; and how many times each probed function ran per run."""
    steps = _summed_steps(rounds)
    runs = items * len(rounds)
    calls = runs * calls_per_item

    def s(label: str) -> float:
        return steps.get(label, (0.0, 0))[0]

    pool = sum(
        seconds for r in rounds for name, seconds in r["cpu_s"].items()
        if name.startswith("tools pool process")
    )  # fmt: skip
    consumer = sum(r["cpu_s"].get("tools pool consumer", 0.0) for r in rounds)
    per_run = {
        "run start: uid claim": s(sp.UID_CLAIM),
        "run start: folders (the workspace made ready, the uid claim left out)": s(sp.START)
        - s(sp.UID_CLAIM),
        "run end: workspace moved aside and deleted": s(sp.END) - s(sp.UID_RELEASE),
        "run end: uid let go (claims, its /tmp), the reset left out": s(sp.UID_RELEASE)
        - s(sp.UID_RESET),
        "run end: uid reset (its processes, IPC, files, keyrings looked for)": s(sp.UID_RESET),
    }
    per_call = {
        "each call: the tool in its workspace (held, run, capped, accounted)": s(sp.RUNNER)
        - s(sp.START)
        - s(sp.END),
        "each call: start marker and sealed answer (Executor.handle less the tool)": s(sp.CALL)
        - s(sp.RUNNER),
        "each call: Celery in the pool process (message, acknowledgement, events)": pool
        - s(sp.CALL),
        "each call: the pool's consumer (Celery's main process)": consumer,
    }
    return {
        "ms_per_run": {k: round(v * 1000 / runs, 3) for k, v in per_run.items()},
        "ms_per_tool_call": {k: round(v * 1000 / calls, 3) for k, v in per_call.items()},
        "probed_functions_per_run": {
            label: round(n / runs, 2) for label, (_, n) in sorted(steps.items())
        },
    }


def orchestrator_parts(rounds: list[dict[str, Any]], calls: int) -> dict[str, float]:
    """Where the orchestrator's CPU went per tool call, by its probes, and the rest."""
    total = calls * len(rounds)
    labels = list(dict.fromkeys(label for r in rounds for label in r["run"]["cpu_s_in"]))
    parts = {
        label: round(sum(r["run"]["cpu_s_in"].get(label, 0.0) for r in rounds) * 1000 / total, 3)
        for label in labels
    }
    whole = sum(r["run"]["cpu_s"] for r in rounds) * 1000 / total
    parts["the rest: agent loop, model client's HTTP, asyncio, replies"] = round(
        whole - sum(parts.values()), 3
    )
    return parts


def real_items_result(
    items: int, calls_per_item: int, processes: int, rounds: dict[str, list[dict[str, Any]]]
) -> CaseResult:
    calls = items * calls_per_item
    toolq, bare = rounds["toolq"], rounds["bare"]
    toolq_rates = [r["rate"] for r in toolq]
    bare_rates = [r["rate"] for r in bare]
    ratios = [t / b for t, b in zip(toolq_rates, bare_rates, strict=True)]
    toolq_cpu = _per_call_ms(toolq, calls)
    bare_cpu = _per_call_ms(bare, calls)
    steps = step_costs(toolq, items, calls_per_item)
    orchestrator = orchestrator_parts(toolq, calls)
    figures = {
        "items": items,
        "tool_calls_per_round": calls,
        "worker_processes_per_pool": processes,
        "rounds": len(toolq),
        "toolq_tool_calls_per_s": [round(r, 1) for r in toolq_rates],
        "bare_tasks_per_s": [round(r, 1) for r in bare_rates],
        "ratios": [round(r, 3) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 3),
        "toolq_cpu_ms_per_tool_call": toolq_cpu,
        "bare_cpu_ms_per_task": bare_cpu,
        "toolq_steps": steps,
        "orchestrator_cpu_ms_per_tool_call": orchestrator,
        "workspaces_removed_per_round": [r["run"]["workspaces_removed"] for r in toolq],
        "tool_call_errors_per_round": [r["run"]["tool_call_errors"] for r in toolq],
    }
    result = CaseResult(
        key=KEY,
        title=f"14. A batch of real items: {items:,} runs of the built-in tools ({calls_per_item} "
        f"calls in 2 turns, a workspace and uid each, let go at the end) vs bare Celery's no-op "
        f"tasks, same run ({processes} processes a pool)",
        figures=figures,
    )
    result.comparisons += [
        Comparison(
            metric=f"real items' tool calls/s vs bare Celery tasks/s (median of {len(toolq)} "
            "alternated rounds)",
            value=round(statistics.median(toolq_rates), 1),
            baseline=round(statistics.median(bare_rates), 1),
            baseline_name="bare Celery, as many no-op tasks in flight, same run",
            unit="calls/s",
            goal=REAL_GOAL,
            higher_is_better=True,
        ),
        Comparison(
            metric="CPU per tool call, every process (real items vs bare Celery's no-op task)",
            value=round(sum(toolq_cpu.values()), 3),
            baseline=round(sum(bare_cpu.values()), 3),
            baseline_name="bare Celery's CPU per task: caller, worker, Redis",
            unit="ms",
        ),
    ]
    result.table = cpu_table(toolq_cpu, bare_cpu) + step_table(steps) + parts_table(orchestrator)
    result.notes.append(ratio_note(figures, toolq_cpu, bare_cpu))
    failed = [output for r in toolq for output in r["run"]["tool_call_error_outputs"]]
    if failed:
        result.notes.append(
            f"{sum(figures['tool_call_errors_per_round'])} tool call(s) answered with an error, "
            f"the first: {failed[0]}"
        )
    return result


def cpu_table(toolq: dict[str, float], bare: dict[str, float]) -> list[str]:
    lines = ["", "| CPU ms per call, by process | real items | bare Celery |", "|---|---:|---:|"]
    lines += [f"| {name} | {ms:.3f} | |" for name, ms in toolq.items()]
    lines += [f"| {name} | | {ms:.3f} |" for name, ms in bare.items()]
    lines.append(f"| **all** | **{sum(toolq.values()):.3f}** | **{sum(bare.values()):.3f}** |")
    return lines


def step_table(steps: dict[str, Any]) -> list[str]:
    lines = ["", "| The tools pool's CPU by step | ms |", "|---|---:|"]
    lines += [f"| {step}, per run | {ms:.3f} |" for step, ms in steps["ms_per_run"].items()]
    lines += [f"| {step}, per call | {ms:.3f} |" for step, ms in steps["ms_per_tool_call"].items()]
    return lines


def parts_table(parts: dict[str, float]) -> list[str]:
    lines = ["", "| The orchestrator's CPU per tool call | ms |", "|---|---:|"]
    return lines + [f"| {part} | {ms:.3f} |" for part, ms in parts.items()]


def ratio_note(figures: dict[str, Any], toolq: dict[str, float], bare: dict[str, float]) -> str:
    cores = len(os.sched_getaffinity(0))
    total = sum(toolq.values())
    return (
        f"{figures['items']:,} real items a round, {figures['rounds']} rounds alternated with "
        f"bare Celery: {figures['median_ratio']:.2f} of bare Celery's rate, the median of the "
        f"rounds' ratios ({', '.join(f'{r:.2f}' for r in figures['ratios'])}). Every process "
        f"together spent {total:.2f} ms of CPU per tool call (bare Celery {sum(bare.values()):.2f}"
        f" ms per task), so {cores} cores run at most {cores * 1000 / total:.0f} such calls/s."
    )
