"""Case 5: a command that prints a gigabyte, through run_bash: what it costs the worker's memory
and how long until the capped answer comes back."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from typing import Any

import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import read_manifest
from api.local.stack import LocalStack
from bench.procinfo import status_kb
from bench.round_trip import RUN_ID
from bench.stats import CaseResult, Comparison
from worker.contract.settings import WorkerSettings

GOAL_MB = 64.0
TIMEOUT_MS = 300_000


def command(size_bytes: int) -> str:
    return f"head -c {size_bytes} /dev/zero | tr '\\0' x"


async def call_run_bash(settings: WorkerSettings, line: str) -> tuple[float, dict[str, Any]]:
    """Seconds until the answer, and run_bash's answer."""
    client = redis.Redis.from_url(settings.redis_url)
    spec = read_manifest(client)["run_bash"]
    client.close()
    async with Dispatcher(settings) as dispatcher:
        request = dispatcher.build_request(
            spec,
            task_id=uuid.uuid4().hex,
            run_id=RUN_ID,
            arguments={"command": line, "timeout": TIMEOUT_MS},
        )
        started = time.perf_counter()
        result = await dispatcher.call(request, spec.pool)
        elapsed = time.perf_counter() - started
    if result.is_error:
        raise RuntimeError(f"run_bash failed: {result.output[:2000]}")
    answer: dict[str, Any] = json.loads(result.output)
    answer["answer_bytes"] = len(result.output.encode())
    return elapsed, answer


def shell_seconds(line: str) -> float:
    """The same command, output thrown away by the shell: the time the bytes take to make."""
    started = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", f"{line} > /dev/null"], check=True)
    return time.perf_counter() - started


def big_output_case(settings: WorkerSettings, stack: LocalStack, size_bytes: int) -> CaseResult:
    """Needs a sandbox worker of concurrency 1 that has already run a call (warm)."""
    main, *children = stack.pids("worker-sandbox")
    processes = {"main": main, **{f"child {pid}": pid for pid in children}}
    before = {name: status_kb(pid, "VmHWM") for name, pid in processes.items()}
    line = command(size_bytes)
    seconds, answer = asyncio.run(call_run_bash(settings, line))
    after = {name: status_kb(pid, "VmHWM") for name, pid in processes.items()}
    growth_mb = {name: round((after[name] - before[name]) / 1024, 1) for name in processes}
    baseline_s = shell_seconds(line)
    worst = max(growth_mb, key=growth_mb.__getitem__)
    result = CaseResult(
        key="big_output",
        title=f"5. A command printing {size_bytes / 2**30:g} GiB through run_bash",
        figures={
            "command": line,
            "bytes_printed": size_bytes,
            "seconds_to_capped_answer": round(seconds, 3),
            "shell_to_dev_null_seconds": round(baseline_s, 3),
            "answer_bytes": answer["answer_bytes"],
            "stdout_truncated": answer["truncated"]["stdout"],
            "exit_code": answer["exit_code"],
            "peak_rss_growth_mb": growth_mb,
            "peak_rss_before_mb": {k: round(v / 1024, 1) for k, v in before.items()},
        },
    )
    result.comparisons += [
        Comparison(
            metric="worker peak RSS growth",
            value=growth_mb[worst],
            baseline=round(before[worst] / 1024, 1),
            baseline_name=f"peak RSS before ({worst} of the sandbox worker)",
            unit="MB",
            goal=GOAL_MB,
            goal_on="value",
        ),
        Comparison(
            metric="time to the capped answer",
            value=round(seconds, 3),
            baseline=round(baseline_s, 3),
            baseline_name="the same command > /dev/null",
            unit="s",
        ),
    ]
    return result
