"""Case 7: what making batch lines tasks costs. The same items run twice through ``toolq batch``:
as tasks (three small files, a set-up command and a check command each) and as plain prompts.

Both batches are the real command in a process of its own, against the scripted model and the
same workers; the difference per item is what the tasks' service calls add (a fresh workspace
and the files through the tools pool, two commands through the sandbox pool).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from api.batch.record import BatchRecord
from api.local.stack import worker_environment
from bench.conversations import scripted_model
from bench.stack import python_path
from bench.stats import CaseResult, Comparison, percentile
from worker.contract.settings import WorkerSettings

CONCURRENCY = 50
#: One tool call, then the answer: a conversation as light as a useful one gets.
STEPS: dict[str, Any] = {
    "description": "bench: one no-op call, then an answer",
    "steps": [{"tool_calls": [{"name": "noop", "arguments": {}}]}, {"content": "done"}],
}
TASK_FIELDS: dict[str, Any] = {
    "files": {
        "README.md": "# A task\n\nAdd the numbers in data/numbers.txt.\n",
        "data/numbers.txt": "\n".join(str(n) for n in range(100)) + "\n",
        "data/config.json": json.dumps({"expected": 4950}),
    },
    "setup": "mkdir -p out && cat data/numbers.txt > out/input.txt",
    "check": "test -s out/input.txt && echo ok",
}


def items(count: int, *, tasks: bool) -> list[dict[str, Any]]:
    extra = TASK_FIELDS if tasks else {}
    return [{"id": f"item-{n}", "prompt": f"task {n}", **extra} for n in range(count)]


def run_batch(
    settings: WorkerSettings, llm_url: str, folder: Path, name: str, lines: list[dict[str, Any]]
) -> dict[str, Any]:
    """``toolq batch`` on ``lines``: its wall time and each item's duration."""
    source, output = folder / f"{name}.jsonl", folder / f"{name}.out.jsonl"
    source.write_text("".join(json.dumps(line) + "\n" for line in lines))
    env = {
        **os.environ,
        **worker_environment(settings),
        "PYTHONPATH": python_path(),
        "OPENAI_BASE_URL": llm_url,
        "OPENAI_API_KEY": "unused",
    }
    argv = [sys.executable, "-m", "api.cli", "batch", str(source), "-o", str(output)]
    argv += ["--concurrency", str(CONCURRENCY), "--model", "scripted"]
    started = time.perf_counter()
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=900, check=False)
    wall_s = time.perf_counter() - started
    results = [BatchRecord.read(json.loads(line)) for line in output.read_text().splitlines()]
    failed = [r for r in results if r.status != "ok" or r.passed is False]
    if done.returncode != 0 or len(results) != len(lines) or failed:
        raise RuntimeError(f"the {name} batch did not go as planned:\n{done.stderr[-3000:]}")
    return {"wall_s": wall_s, "durations_ms": [(r.duration_s or 0.0) * 1000 for r in results]}


def tasks_case(settings: WorkerSettings, count: int, repeats: int) -> CaseResult:
    walls: dict[str, list[float]] = {"plain": [], "tasks": []}
    durations: dict[str, list[float]] = {"plain": [], "tasks": []}
    with scripted_model(STEPS) as (llm_url, _), tempfile.TemporaryDirectory() as folder:
        for repeat in range(repeats):
            # Alternated, so that a machine busy for a while weighs on both alike.
            for name in ("plain", "tasks"):
                ran = run_batch(
                    settings,
                    llm_url,
                    Path(folder),
                    f"{name}-{repeat}",
                    items(count, tasks=name == "tasks"),
                )
                walls[name].append(ran["wall_s"])
                durations[name] += ran["durations_ms"]
    wall = {name: statistics.median(values) for name, values in walls.items()}
    per_item_ms = {name: wall[name] * 1000 / count for name in wall}
    p50 = {name: percentile(values, 50) for name, values in durations.items()}
    extra_ms = per_item_ms["tasks"] - per_item_ms["plain"]
    result = CaseResult(
        key="tasks",
        title=f"7. Batch tasks: {count:,} items with 3 files, a set-up and a check, against the "
        f"same items without them (toolq batch, concurrency {CONCURRENCY})",
        figures={
            "items": count,
            "repeats": repeats,
            "wall_s_median": {name: round(seconds, 3) for name, seconds in wall.items()},
            "wall_ms_per_item": {name: round(ms, 2) for name, ms in per_item_ms.items()},
            "extra_wall_ms_per_item": round(extra_ms, 2),
            "item_duration_p50_ms": {name: round(ms, 1) for name, ms in p50.items()},
            "extra_item_duration_p50_ms": round(p50["tasks"] - p50["plain"], 1),
        },
        samples_ms={f"item duration, {name}": values for name, values in durations.items()},
    )
    result.comparisons += [
        Comparison(
            metric=metric,
            value=round(figure["tasks"], 3),
            baseline=round(figure["plain"], 3),
            baseline_name=baseline_name,
            unit=unit,
        )
        for metric, figure, baseline_name, unit in (
            (
                "batch wall time per item, as tasks",
                per_item_ms,
                "the same items as plain prompts",
                "ms/item",
            ),
            ("one item's duration (p50), as a task", p50, "the same item as a plain prompt", "ms"),
        )
    ]
    ratio = per_item_ms["tasks"] / per_item_ms["plain"]
    longer = p50["tasks"] - p50["plain"]
    result.notes.append(
        f"Making each of {count:,} items a task (3 files, a set-up and a check) added "
        f"{extra_ms:.1f} ms of batch wall time per item ({ratio:.2f}x) and {longer:.0f} ms to "
        "an item's own duration (p50): per item, a fresh workspace and the files through the "
        "tools pool, two commands through the sandbox pool (compare case 4's run_bash through "
        "the pool). With one worker process per pool the commands run one at a time, so items "
        "queue for the sandbox pool; more sandbox processes take the wall time down. Each "
        "batch's wall time includes starting the toolq process."
    )
    return result
