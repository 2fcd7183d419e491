"""Case 10: the same batch of conversations run three ways, in the same run: ``toolq batch`` in one
orchestrator process, and ``toolq batch --on-fleet`` on 1 and on 2 agents worker processes.

Each conversation is case 3's: three turns of two parallel no-op calls against the scripted
model. The batch process is the same command each time and writes the same output; only where
the conversations run changes. The CPU of every process is read as it was spent.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from api.local.stack import LocalStack, worker_environment
from bench.conversations import CALLS_PER_TURN, TURNS_WITH_TOOLS, scripted_model, write_prompts
from bench.cost import redis_cpu_seconds
from bench.procinfo import cpu_seconds
from bench.stack import PLUGIN, python_path, run_checked
from bench.stats import CaseResult, Comparison
from worker.contract.settings import WorkerSettings
from worker.contract.wire import AGENTS_QUEUE

TOOLQ = str(Path(sys.executable).with_name("toolq"))
HERE = "one orchestrator process"


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


@contextlib.contextmanager
def agents_workers(
    settings: WorkerSettings, processes: int, per_process: int, model_env: dict[str, str]
) -> Iterator[list[int]]:
    """``processes`` agents workers of ``per_process`` conversations each; their pids."""
    saved = dict(os.environ)
    os.environ.update(model_env | {"TOOLQ_AGENT_CONCURRENCY": str(per_process)})
    try:
        with contextlib.ExitStack() as stacks:
            pids = []
            for _ in range(processes):
                stack = LocalStack(settings, plugins=[PLUGIN], pools=(AGENTS_QUEUE,))
                stacks.callback(stack.stop)
                stack.start_workers(settings)
                pids.append(stack.pids(f"worker-{AGENTS_QUEUE}")[0])
            os.environ.clear()
            os.environ.update(saved)
            yield pids
    finally:
        os.environ.clear()
        os.environ.update(saved)


def run_batch(
    settings: WorkerSettings, items: Path, model_env: dict[str, str], *, on_fleet: bool
) -> dict[str, Any]:
    """``toolq batch`` over ``items``: its wall time (the whole command, start-up included: the
    same for every arrangement), its CPU, and the lines it wrote."""
    output = items.with_suffix(f".{'fleet' if on_fleet else 'here'}.{time.monotonic_ns()}.out")
    count = len(items.read_text().splitlines())
    argv = [TOOLQ, "batch", str(items), "-o", str(output), "--concurrency", str(count)]
    argv += ["--model", "scripted", *(["--on-fleet"] if on_fleet else [])]
    # On the fleet the batch process needs no model at all: the agents workers ask it.
    env = {**os.environ, **worker_environment(settings), "PYTHONPATH": python_path()}
    env |= {} if on_fleet else model_env
    cpu_before = _children_cpu()
    started = time.perf_counter()
    done = run_checked(argv, env, "toolq batch", timeout=900)
    command_s = time.perf_counter() - started
    records = [json.loads(line) for line in output.read_text().splitlines()]
    output.unlink()
    calls = sum(len(r["tool_calls"]) for r in records)
    expected = count * TURNS_WITH_TOOLS * CALLS_PER_TURN
    if len(records) != count or calls != expected or any(r["status"] != "ok" for r in records):
        raise RuntimeError(f"the conversations did not go as scripted: {done.stderr[-2000:]}")
    return {
        "conversations": count,
        "tool_calls": calls,
        "wall_s": round(command_s, 3),
        "batch_process_cpu_s": round(_children_cpu() - cpu_before, 3),
        "reruns": sum(r["attempts"] > 1 for r in records),
        "processes": len({r["orchestrator"] for r in records}),
    }


def measure(
    settings: WorkerSettings,
    items: Path,
    model_env: dict[str, str],
    tool_workers: list[int],
    llm_pid: int,
    agents: list[int],
) -> dict[str, Any]:
    """One arrangement: the batch and the CPU each process spent on it."""
    client = redis.Redis.from_url(settings.redis_url)
    watched = {"tools workers": tool_workers, "agents workers": agents, "scripted model": [llm_pid]}
    before = {name: sum(map(cpu_seconds, pids)) for name, pids in watched.items()}
    redis_before = redis_cpu_seconds(client)
    run = run_batch(settings, items, model_env, on_fleet=bool(agents))
    cpu = {"batch process": run.pop("batch_process_cpu_s")}
    cpu |= {name: sum(map(cpu_seconds, pids)) - before[name] for name, pids in watched.items()}
    cpu["redis"] = redis_cpu_seconds(client) - redis_before
    client.close()
    run["conversations_per_s"] = round(run["conversations"] / run["wall_s"], 1)
    run["cpu_s_by_process"] = {name: round(seconds, 2) for name, seconds in cpu.items()}
    orchestrating = cpu["batch process"] + cpu["agents workers"]
    run["orchestration_cpu_ms_per_tool_call"] = round(orchestrating * 1000 / run["tool_calls"], 3)
    return run


def agents_pool_case(
    settings: WorkerSettings,
    tool_workers: list[int],
    conversations: int,
    processes: tuple[int, ...] = (1, 2),
) -> CaseResult:
    with (
        scripted_model() as (llm_url, llm_pid),
        tempfile.TemporaryDirectory(prefix="toolq-bench-agents-") as folder,
    ):
        items = write_prompts(Path(folder) / "items.jsonl", conversations)
        model_env = {"OPENAI_BASE_URL": llm_url, "OPENAI_API_KEY": "unused"}
        runs = {HERE: measure(settings, items, model_env, tool_workers, llm_pid, [])}
        for count in processes:
            per_process = -(-conversations // count)
            with agents_workers(settings, count, per_process, model_env) as agents:
                label = f"{count} agents worker process{'es' if count > 1 else ''}"
                runs[label] = measure(settings, items, model_env, tool_workers, llm_pid, agents)
    result = CaseResult(
        key="agents_pool",
        title=f"10. Scaling conversations: {conversations:,} conversations in {HERE} vs on "
        f"{' and '.join(map(str, processes))} agents worker processes (toolq batch, same run)",
        figures={"conversations": conversations, "by_arrangement": runs},
    )
    here = runs[HERE]
    for label, run in runs.items():
        if label == HERE:
            continue
        result.comparisons += [
            Comparison(
                metric=metric,
                value=run[figure],
                baseline=here[figure],
                baseline_name=f"toolq batch in {HERE}",
                unit=unit,
                higher_is_better=higher_is_better,
            )
            for figure, metric, unit, higher_is_better in (
                ("conversations_per_s", f"conversations/s on {label}", "conversations/s", True),
                (
                    "orchestration_cpu_ms_per_tool_call",
                    f"orchestration CPU per tool call on {label} (batch process + agents)",
                    "ms",
                    False,
                ),
            )
        ]
    result.notes.append(cpu_note(runs))
    return result


def cpu_note(runs: dict[str, dict[str, Any]]) -> str:
    """Where the CPU went in each arrangement, per conversation."""
    parts = []
    for label, run in runs.items():
        per = run["conversations"]
        spent = ", ".join(
            f"{name} {seconds * 1000 / per:.1f} ms"
            for name, seconds in run["cpu_s_by_process"].items()
            if seconds > 0
        )
        parts.append(f"{label}: {run['wall_s']:.1f} s, {spent}")
    return (
        "CPU per conversation by process — "
        + "; ".join(parts)
        + ". On a machine of few cores every arrangement shares them with the tool workers, the "
        "model server and Redis: more agents worker processes spread the conversations' CPU, "
        "they do not add cores."
    )
