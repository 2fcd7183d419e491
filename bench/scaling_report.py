"""Case 11's report: the curve as a table and a plot, the goal where the machine can judge it,
and the broker's ceiling."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from bench.scaling import BARE, TOOLQ
from bench.stats import CaseResult, Comparison

#: K instances give at least this share of K times one instance's rate, until Redis saturates.
SCALING_GOAL = 0.8
#: Redis's main thread busy this share of the time is saturated: a step beyond is Redis's rate.
SATURATED = 0.9
IMAGE = "scaling.png"


def _ceiling(ms_per_call: float) -> float | None:
    """Calls/s at which a Redis spending ``ms_per_call`` of its main thread per call is busy
    all the time; None when too little CPU was counted to tell (a tiny run)."""
    return round(1000 / ms_per_call) if ms_per_call > 0 else None


def broker_ceiling(curve: dict[int, dict[str, Any]], system: str) -> dict[str, Any]:
    """Extrapolated from the busiest step: the most calls per second, Redis's CPU per call."""
    count, step = max(curve.items(), key=lambda item: item[1][system]["calls_per_s"])
    ms = step[system]["redis_ms_per_call"]
    ceiling = _ceiling(ms)
    one = curve[1][system]["calls_per_s"]
    return {
        "calls_per_s": ceiling,
        "redis_ms_per_call": ms,
        "from_instances": count,
        "instances_at_one_instance_rate": None if ceiling is None else round(ceiling / one, 1),
    }


def judged_up_to(curve: dict[int, dict[str, Any]], cores: int) -> int:
    """The most instances this machine has the cores for: one instance with its caller and
    Redis kept ``cores_busy`` cores busy, and K of them need K times as many."""
    per_instance = curve[1][TOOLQ]["cores_busy"]
    return max(1, math.floor(cores / per_instance)) if per_instance > 0 else 1


def scaling_case(
    curve: dict[int, dict[str, Any]],
    split: dict[str, float],
    concurrency: int,
    calls: int,
    cores: int,
) -> CaseResult:
    fits = judged_up_to(curve, cores)
    ceilings = {system: broker_ceiling(curve, system) for system in (TOOLQ, BARE)}
    two_redis = max(split["broker_redis_ms_per_call"], split["results_redis_ms_per_call"])
    split_figures = {
        **split,
        "ceiling_two_redis_calls_per_s": _ceiling(two_redis),
        "ceiling_results_redis_alone_calls_per_s": _ceiling(split["results_redis_ms_per_call"]),
    }
    result = CaseResult(
        key="scaling",
        title=f"11. Throughput against worker instances (concurrency {concurrency} each)",
        figures={
            "concurrency_per_instance": concurrency,
            "calls_per_caller": calls,
            "usable_cores": cores,
            "goal_judged_up_to_instances": fits,
            "by_instances": {str(count): step for count, step in curve.items()},
            "broker_ceiling": ceilings,
            "broker_and_results_on_a_redis_each": split_figures,
        },
        table=curve_table(curve, concurrency),
        image=IMAGE,
    )
    one = curve[1][TOOLQ]["calls_per_s"]
    for count, step in curve.items():
        rate = step[TOOLQ]["calls_per_s"]
        if count > 1:
            judged = count <= fits and step[TOOLQ]["redis_main_thread_busy"] < SATURATED
            result.comparisons.append(
                Comparison(
                    metric=f"calls/s, {count} instances",
                    value=rate,
                    baseline=round(count * one, 1),
                    baseline_name=f"{count} x one instance's rate",
                    unit="calls/s",
                    goal=SCALING_GOAL if judged else None,
                    higher_is_better=True,
                )
            )
        result.comparisons.append(
            Comparison(
                metric=f"calls/s, {count} instance{'s' if count > 1 else ''}, next to bare Celery",
                value=rate,
                baseline=step[BARE]["calls_per_s"],
                baseline_name="bare Celery, as many instances",
                unit="calls/s",
            )
        )
    result.notes += [
        _cores_note(curve, cores, fits),
        _ceiling_note(ceilings, concurrency),
        _split_note(split_figures),
        METHOD_NOTE,
    ]
    return result


def curve_table(curve: dict[int, dict[str, Any]], concurrency: int) -> list[str]:
    rows = [
        "| instances x concurrency | toolq calls/s | / (K x 1 instance) | bare Celery tasks/s | "
        "/ (K x 1 instance) | Redis main thread busy, toolq / bare | Redis CPU ms per call, "
        "toolq / bare | cores busy, toolq / bare |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for count, step in curve.items():
        toolq, bare = step[TOOLQ], step[BARE]
        scale = [
            step[system]["calls_per_s"] / (count * curve[1][system]["calls_per_s"])
            for system in (TOOLQ, BARE)
        ]
        rows.append(
            f"| {count} x {concurrency} | {toolq['calls_per_s']:,.0f} | {scale[0]:.2f} | "
            f"{bare['calls_per_s']:,.0f} | {scale[1]:.2f} | "
            f"{toolq['redis_main_thread_busy']:.2f} / {bare['redis_main_thread_busy']:.2f} | "
            f"{toolq['redis_ms_per_call']:.3f} / {bare['redis_ms_per_call']:.3f} | "
            f"{toolq['cores_busy']:.2f} / {bare['cores_busy']:.2f} |"
        )
    return rows


def _cores_note(curve: dict[int, dict[str, Any]], cores: int, fits: int) -> str:
    per_instance = curve[1][TOOLQ]["cores_busy"]
    beyond = [count for count in curve if count > fits]
    tail = (
        f" The steps of {', '.join(map(str, beyond))} instances ran on fewer cores than they "
        "need: they show this machine's ceiling, not toolq's or Redis's, and the goal is not "
        "judged there."
        if beyond
        else ""
    )
    return (
        f"One instance, its caller and Redis kept {per_instance:.2f} cores busy; K instances "
        f"need K times as many, so on this machine's {cores} usable cores the goal (K instances "
        f"give at least {SCALING_GOAL:g} x K times one instance's rate, until Redis's main "
        f"thread is {SATURATED:.0%} busy) is judged up to {fits} instance(s).{tail}"
    )


def _ceiling_note(ceilings: dict[str, dict[str, Any]], concurrency: int) -> str:
    toolq, bare = ceilings[TOOLQ], ceilings[BARE]
    if toolq["calls_per_s"] is None or bare["calls_per_s"] is None:
        return "Too little Redis CPU was counted to extrapolate the broker's ceiling (tiny run)."
    return (
        "The broker's ceiling: Redis runs every command on its main thread. At the busiest "
        f"step ({toolq['from_instances']} instance(s)) it spent {toolq['redis_ms_per_call']:.3f} "
        f"ms of it per toolq call ({bare['redis_ms_per_call']:.3f} per bare Celery task), so "
        f"one Redis saturates at about {toolq['calls_per_s']:,} toolq calls/s "
        f"({bare['calls_per_s']:,} bare Celery tasks/s): the rate of about "
        f"{toolq['instances_at_one_instance_rate']} instances of concurrency {concurrency} "
        "running no-op calls. Extrapolated in a straight line: Redis spends less per command as "
        "its load grows (more commands per wake-up), so the real ceiling is higher, not lower."
    )


def _split_note(split: dict[str, Any]) -> str:
    broker, results = split["broker_redis_ms_per_call"], split["results_redis_ms_per_call"]
    two = split["ceiling_two_redis_calls_per_s"]
    alone = split["ceiling_results_redis_alone_calls_per_s"]
    if two is None or alone is None:
        return "Too little Redis CPU was counted to split it between broker and results (tiny run)."
    return (
        "With the broker and the result store on a Redis each (TOOLQ_RESULT_BACKEND), one "
        f"instance at {split['calls_per_s']:,.0f} calls/s: the broker's Redis spent {broker:.3f} "
        f"ms of its main thread per call, the result store's {results:.3f}. Two Redis servers "
        f"so carry about {two:,} calls/s; with RabbitMQ as the broker, what stays on Redis is "
        f"the result store's share, about {alone:,} calls/s (RabbitMQ's own ceiling is not "
        "measured here)."
    )


METHOD_NOTE = (
    "Each instance is a tools-pool worker (celery -A worker.app worker -Q tools) with the "
    "concurrency of deploy/k8s/worker-tools.yaml, and bare Celery runs as many instances of the "
    "same concurrency. The calls come from one caller process per instance (python -m "
    "bench.load_caller), each sending its calls at once: a caller spends less CPU per call than "
    "an instance's consumer, so with a core each the callers do not set the pace. Redis's CPU "
    "is its main thread's, read from /proc/<pid>/task/<pid>/stat; cores busy counts the "
    "callers, the instances and the whole Redis process."
)


def plot_scaling(path: Path, case: CaseResult) -> None:
    """Calls/s against instances, beside K x one instance and the broker's ceiling; and Redis's
    main thread against calls/s, extrapolated to a full core."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = {int(k): v for k, v in case.figures["by_instances"].items()}
    counts = sorted(curve)
    figure, (rates, busy) = plt.subplots(1, 2, figsize=(13, 4.8), layout="constrained")
    for system, marker, color in ((TOOLQ, "o", "C0"), (BARE, "s", "C2")):
        values = [curve[k][system]["calls_per_s"] for k in counts]
        rates.plot(counts, values, marker=marker, color=color, label=system)
        ideal = [k * values[0] for k in counts]
        label = f"{system}: K x one instance"
        rates.plot(counts, ideal, linestyle=":", color=color, alpha=0.6, label=label)
        shares = [curve[k][system]["redis_main_thread_busy"] for k in counts]
        busy.plot(values, shares, marker=marker, color=color, label=system)
        ceiling = case.figures["broker_ceiling"][system]["calls_per_s"]
        if ceiling:
            label = f"{system}, extrapolated"
            busy.plot([0, ceiling], [0, 1], linestyle=":", color=color, alpha=0.6, label=label)
            label = f"{system}: Redis saturated"
            rates.axhline(ceiling, color=color, linestyle="--", alpha=0.5, label=label)
    goal = [SCALING_GOAL * k * curve[1][TOOLQ]["calls_per_s"] for k in counts]
    label = f"goal: {SCALING_GOAL:g} x K x one"
    rates.plot(counts, goal, linestyle="-.", color="C3", alpha=0.5, label=label)
    rates.set_xscale("log", base=2)
    rates.set_xticks(counts, [str(k) for k in counts])
    rates.set_xlabel(f"worker instances (concurrency {case.figures['concurrency_per_instance']})")
    rates.set_ylabel("no-op calls/s")
    rates.set_title(case.title, fontsize=10)
    busy.axhline(1.0, color="grey", linestyle="--")
    busy.set_xlabel("calls/s")
    busy.set_ylabel("Redis main thread busy (share of one core)")
    busy.set_title("Redis's CPU: where the broker saturates", fontsize=10)
    for axis in (rates, busy):
        axis.grid(True, alpha=0.3)
        axis.legend(fontsize=7)
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
