"""Case 13: the batch path as fast as its tool calls allow. ``toolq batch`` runs a few hundred
conversations at once (case 3's: turns of two parallel no-op calls against the scripted model, on
the same cores), and bare Celery runs as many no-op tasks, in flight at once, on as many worker
processes, in the same run: the batch's tool calls per second over bare Celery's tasks per
second.

The two alternate, so that a machine busy for a while weighs on both alike. The batch's rate is
the one its summary reports, whose clock starts with its first conversation: the command's start
(imports, the fleet read from Redis) is counted apart. The CPU of every process is read as it
was spent: bare Celery has no model to ask nor conversations to keep, so its rate is a ceiling
the batch can near but not reach on the same cores.
"""

from __future__ import annotations

import json
import os
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import redis

from api.local.stack import LocalStack, worker_environment
from bench.conversations import CALLS_PER_TURN, TURNS_WITH_TOOLS, scripted_model, write_prompts
from bench.cost import redis_cpu_seconds
from bench.procinfo import cpu_seconds, process_tree
from bench.stack import BareWorker, python_path
from bench.stats import CaseResult, Comparison
from bench.throughput import bare_throughput
from worker.contract.settings import WorkerSettings

#: The batch's tool calls per second over bare Celery's no-op tasks per second, same run.
BATCH_GOAL = 0.7
#: Conversations of the small batch that warms up, and that tells the command's fixed CPU (its
#: start, the fleet read, the summary) from what each tool call adds.
SMALL_BATCH = 10
#: The line of the batch's summary that gives its tool calls and their rate.
_SUMMARY = re.compile(r"Tool calls: (\d+) \(([\d.]+)/s\), (\d+) failed")


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run_batch(
    settings: WorkerSettings, llm_url: str, items: Path, watched: dict[str, list[int]]
) -> dict[str, Any]:
    """``toolq batch`` over ``items``, all at once: its rate, and the CPU of every process."""
    count = len(items.read_text().splitlines())
    output = items.with_suffix(f".{time.monotonic_ns()}.out")
    argv = [sys.executable, "-m", "api.cli", "batch", str(items), "-o", str(output)]
    argv += ["--concurrency", str(count), "--model", "scripted"]
    env = {
        **os.environ,
        **worker_environment(settings),
        "PYTHONPATH": python_path(),
        "OPENAI_BASE_URL": llm_url,
        "OPENAI_API_KEY": "unused",
    }
    client = redis.Redis.from_url(settings.redis_url)
    before = {name: sum(map(cpu_seconds, pids)) for name, pids in watched.items()}
    batch_before, redis_before = _children_cpu(), redis_cpu_seconds(client)
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    command_s = time.perf_counter() - started
    cpu = {"batch process": _children_cpu() - batch_before}
    cpu |= {name: sum(map(cpu_seconds, pids)) - before[name] for name, pids in watched.items()}
    cpu["redis"] = redis_cpu_seconds(client) - redis_before
    client.close()
    summary = _SUMMARY.search(done.stderr)
    records = [json.loads(line) for line in output.read_text().splitlines()]
    output.unlink()
    expected = count * TURNS_WITH_TOOLS * CALLS_PER_TURN
    if (
        done.returncode != 0
        or summary is None
        or int(summary[1]) != expected
        or int(summary[3])
        or len(records) != count
        or any(record["status"] != "ok" for record in records)
    ):
        raise RuntimeError(f"the batch did not go as scripted:\n{done.stderr[-3000:]}")
    calls = int(summary[1])
    return {
        "tool_calls": calls,
        "tool_calls_per_s": float(summary[2]),
        "command_s": round(command_s, 3),
        "command_tool_calls_per_s": round(calls / command_s, 1),
        "cpu_ms_per_tool_call": {name: round(s * 1000 / calls, 3) for name, s in cpu.items()},
    }


def batch_throughput_case(
    settings: WorkerSettings,
    stack: LocalStack,
    bare: BareWorker,
    processes: int,
    conversations: int,
    repeats: int,
) -> CaseResult:
    calls = conversations * TURNS_WITH_TOOLS * CALLS_PER_TURN
    batches: list[dict[str, Any]] = []
    bare_rates: list[float] = []
    bare_cpu_ms: list[float] = []
    with (
        scripted_model() as (llm_url, llm_pid),
        tempfile.TemporaryDirectory(prefix="toolq-bench-batch-") as folder,
    ):
        items = write_prompts(Path(folder) / "items.jsonl", conversations)
        watched = {"tools workers": stack.pids("worker-tools"), "scripted model": [llm_pid]}
        # Warm: connections, the workers' first calls, the page cache; on both systems.
        small = write_prompts(Path(folder) / "small.jsonl", SMALL_BATCH, "s")
        small_run = run_batch(settings, llm_url, small, watched)
        if conversations > SMALL_BATCH:
            small_run = run_batch(settings, llm_url, small, watched)
        bare_throughput(bare, min(calls, 300))
        for repeat in range(repeats):
            for which in ("bare", "batch") if repeat % 2 == 0 else ("batch", "bare"):
                if which == "bare":
                    pids = process_tree(bare.proc.pid)
                    before = sum(map(cpu_seconds, pids))
                    bare_rates.append(bare_throughput(bare, calls))
                    bare_cpu_ms.append((sum(map(cpu_seconds, pids)) - before) * 1000 / calls)
                else:
                    batches.append(run_batch(settings, llm_url, items, watched))
    bare_workers_cpu = round(statistics.fmean(bare_cpu_ms), 3)
    rate = statistics.fmean(run["tool_calls_per_s"] for run in batches)
    bare_rate = statistics.fmean(bare_rates)
    cpu = {
        name: round(statistics.fmean(run["cpu_ms_per_tool_call"][name] for run in batches), 3)
        for name in batches[0]["cpu_ms_per_tool_call"]
    }
    # The batch process's CPU less its fixed part (its start, the fleet read, the summary), read
    # from the small batch: what each tool call adds. (Quick sizes: the small batch is the batch.)
    per_call = cpu["batch process"]
    if conversations > SMALL_BATCH:
        small_calls = small_run["tool_calls"]
        small_s = small_run["cpu_ms_per_tool_call"]["batch process"] * small_calls / 1000
        per_call = round(
            (cpu["batch process"] * calls / 1000 - small_s) * 1000 / (calls - small_calls), 3
        )
    figures = {
        "conversations": conversations,
        "worker_processes": processes,
        "tool_calls_per_batch": calls,
        "repeats": repeats,
        "batch_tool_calls_per_s": round(rate, 1),
        "bare_celery_tasks_per_s": round(bare_rate, 1),
        "batch_runs_per_s": [run["tool_calls_per_s"] for run in batches],
        "bare_runs_per_s": [round(r, 1) for r in bare_rates],
        "command_tool_calls_per_s": [run["command_tool_calls_per_s"] for run in batches],
        "cpu_ms_per_tool_call": cpu,
        "batch_process_cpu_ms_per_tool_call_start_excluded": per_call,
        "bare_celery_workers_cpu_ms_per_task": bare_workers_cpu,
    }
    result = CaseResult(
        key="batch_throughput",
        title=f"13. The batch path: toolq batch of {conversations:,} conversations "
        f"({TURNS_WITH_TOOLS} turns of {CALLS_PER_TURN} parallel no-op calls) vs bare Celery's "
        f"no-op tasks, same run ({processes} worker processes)",
        figures=figures,
    )
    result.comparisons.append(
        Comparison(
            metric=f"toolq batch tool calls/s vs bare Celery tasks/s ({processes} processes)",
            value=round(rate, 1),
            baseline=round(bare_rate, 1),
            baseline_name="bare Celery, as many no-op tasks in flight, same run",
            unit="calls/s",
            goal=BATCH_GOAL,
            higher_is_better=True,
        )
    )
    result.comparisons.append(
        Comparison(
            metric="batch process CPU per tool call (its start left out) vs the workers'",
            value=per_call,
            baseline=cpu["tools workers"],
            baseline_name="the tools workers' CPU per tool call, same calls",
            unit="ms",
        )
    )
    marginal = cpu | {"batch process": per_call}
    result.notes.append(
        batch_note(conversations, rate, bare_rate, marginal, bare_workers_cpu, batches)
    )
    return result


def batch_note(
    conversations: int,
    rate: float,
    bare_rate: float,
    cpu: dict[str, float],
    bare_workers_ms: float,
    batches: list[dict[str, Any]],
) -> str:
    """The ratio, and the CPU that bounds it: every process of the batch shares the cores
    (``cpu``: each one's per tool call, the batch process's start left out)."""
    cores = len(os.sched_getaffinity(0))
    total = sum(cpu.values())
    ceiling = cores * 1000 / total
    parts = ", ".join(f"{name} {ms:.2f} ms" for name, ms in cpu.items())
    command = statistics.fmean(run["command_tool_calls_per_s"] for run in batches)
    return (
        f"toolq batch of {conversations:,} conversations ran {rate:.0f} tool calls/s, "
        f"{rate / bare_rate:.2f} of bare Celery's {bare_rate:.0f} no-op tasks/s in the same run "
        f"({command:.0f}/s counting the command's own start). CPU per tool call (the batch "
        f"process's start left out): {parts}; "
        f"{total:.2f} ms in all, so {cores} cores cannot run more than {ceiling:.0f} calls/s "
        f"({ceiling / bare_rate:.2f} of bare Celery's rate) however the work is split. Bare "
        f"Celery's workers spend {bare_workers_ms:.2f} ms per task with nothing else to run; the "
        "batch's workers share the cores with the batch process, the model and Redis."
    )
