"""Case 2: many no-op calls in flight at once, toolq next to bare Celery, on the same workers."""

from __future__ import annotations

import asyncio
import statistics
import time
from collections.abc import Callable
from typing import Any

from celery.result import ResultSet

from api.calls.dispatch import Dispatcher
from api.local.stack import LocalStack
from bench.cost import CostMeter
from bench.procinfo import process_tree
from bench.round_trip import noop_burst, noop_spec
from bench.stack import TRANSPORT_NOTE, BareWorker
from bench.stats import CaseResult, Comparison
from worker.contract.settings import WorkerSettings


async def toolq_throughput(settings: WorkerSettings, calls: int) -> float:
    """Calls per second with ``calls`` sent at once through one Dispatcher."""
    spec = noop_spec(settings)
    async with Dispatcher(settings) as dispatcher:
        started = time.perf_counter()
        failed = await noop_burst(dispatcher, spec, calls)
        elapsed = time.perf_counter() - started
    if failed:
        raise RuntimeError(f"{failed} of {calls} noop calls failed")
    return calls / elapsed


def bare_throughput(bare: BareWorker, calls: int) -> float:
    """Tasks per second: ``calls`` apply_async, then every result collected with join_native."""
    started = time.perf_counter()
    results = ResultSet([bare.task.apply_async() for _ in range(calls)], app=bare.app)
    results.join_native(timeout=600)
    elapsed = time.perf_counter() - started
    return calls / elapsed


#: Calls per second, and where the CPU went (``CostMeter.stop``).
Measured = tuple[float, dict[str, Any]]


def measure(
    settings: WorkerSettings,
    stack: LocalStack,
    bare: BareWorker,
    calls: int,
    warmup: int,
    *,
    repeats: int = 2,
) -> dict[str, Any]:
    """Both systems after a smaller warm-up burst of each, with where their CPU went.

    The runs alternate toolq, bare, bare, toolq, ... so that a change in the machine's other
    load over the case weighs on both alike; the figures are the means over ``repeats`` each.
    """
    asyncio.run(toolq_throughput(settings, warmup))
    bare_throughput(bare, warmup)

    def toolq() -> Measured:
        meter = CostMeter(settings.redis_url, lambda: stack.pids("worker-tools"))
        meter.start()
        rate = asyncio.run(toolq_throughput(settings, calls))
        return rate, meter.stop(calls)

    def baseline() -> Measured:
        meter = CostMeter(settings.redis_url, lambda: process_tree(bare.proc.pid))
        meter.start()
        rate = bare_throughput(bare, calls)
        return rate, meter.stop(calls)

    runs: dict[Callable[[], Measured], list[Measured]] = {toolq: [], baseline: []}
    for repeat in range(repeats):
        for run in (toolq, baseline) if repeat % 2 == 0 else (baseline, toolq):
            runs[run].append(run())
    return {
        "toolq_calls_per_s": round(statistics.fmean(r for r, _ in runs[toolq]), 1),
        "bare_tasks_per_s": round(statistics.fmean(r for r, _ in runs[baseline]), 1),
        "toolq_runs_per_s": [round(r, 1) for r, _ in runs[toolq]],
        "bare_runs_per_s": [round(r, 1) for r, _ in runs[baseline]],
        "toolq_cost": mean_cost([c for _, c in runs[toolq]]),
        "bare_cost": mean_cost([c for _, c in runs[baseline]]),
    }


def mean_cost(costs: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures of several ``CostMeter.stop`` results, averaged key by key."""
    merged: dict[str, Any] = {}
    for section in costs[0]:
        names = sorted({name for cost in costs for name in cost[section]})
        merged[section] = {
            name: round(statistics.fmean(cost[section].get(name, 0) for cost in costs), 3)
            for name in names
        }
    return merged


def throughput_case(by_concurrency: dict[int, dict[str, Any]], calls: int) -> CaseResult:
    result = CaseResult(
        key="throughput",
        title=f"2. Throughput: {calls:,} no-op calls in flight",
        figures={"calls": calls, "by_worker_processes": by_concurrency},
    )
    for concurrency, figures in sorted(by_concurrency.items()):
        result.comparisons.append(
            Comparison(
                metric=f"calls/s, {concurrency} worker process{'es' if concurrency > 1 else ''}",
                value=figures["toolq_calls_per_s"],
                baseline=figures["bare_tasks_per_s"],
                baseline_name="bare Celery",
                unit="calls/s",
                goal=1.0,
                higher_is_better=True,
            )
        )
        result.notes.append(cost_note(concurrency, figures))
    subscribes = max(
        figures["toolq_cost"]["redis_commands_per_call"].get("subscribe", 0)
        for figures in by_concurrency.values()
    )
    if subscribes >= 0.5:
        result.notes.append(SUBSCRIBE_NOTE)
    result.notes.append(TRANSPORT_NOTE)
    return result


SUBSCRIBE_NOTE = (
    "toolq's caller SUBSCRIBEs to Celery's result channel for every call, and UNSUBSCRIBEs "
    "later, though its answers come through its own reply list: two Redis round trips per "
    "call in the one thread that publishes. Sending with ignore_result=True makes Celery "
    "skip backend.on_task_call."
)


def cost_note(concurrency: int, figures: dict[str, Any]) -> str:
    """One line saying where each system's CPU went per call, and what Redis had to do."""
    toolq, bare = figures["toolq_cost"], figures["bare_cost"]

    def cpu(cost: dict[str, Any]) -> str:
        parts = cost["cpu_ms_per_call"]
        return ", ".join(f"{who} {ms:.3f}" for who, ms in parts.items())

    def commands(cost: dict[str, Any]) -> str:
        found = cost["redis_commands_per_call"]
        total = sum(found.values())
        return f"{total:.1f} ({', '.join(f'{k} {v:g}' for k, v in found.items())})"

    def pace(cost: dict[str, Any]) -> str:
        consumer = cost["cpu_ms_per_call"]["workers' consumer"]
        return f"{consumer:.3f} ms per call, at most {1000 / consumer:.0f} calls/s"

    return (
        f"Throughput with {concurrency} worker process(es), CPU ms per call — toolq: "
        f"{cpu(toolq)}; bare Celery: {cpu(bare)}. The workers' consumer (Celery's main process, "
        "which takes each message, hands it to a pool process and acknowledges it) is one "
        f"process whatever the pool's size: toolq {pace(toolq)} with a core to itself; bare "
        f"Celery {pace(bare)}. Redis commands per call, those run inside Lua scripts included "
        f"— toolq: {commands(toolq)}; bare Celery: {commands(bare)}."
    )
