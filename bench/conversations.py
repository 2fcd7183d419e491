"""Case 3: many conversations at once against the scripted model, each turn two no-op calls.

The scripted model and the orchestrator run in processes of their own, so neither shares the
other's GIL; the CPU each process spent is reported, since on a small machine they all compete.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import redis

from api.local.stack import LocalStack, free_port, worker_environment
from bench.cost import redis_cpu_seconds
from bench.orchestrator import PUBLISH_PROBE
from bench.procinfo import cpu_seconds
from bench.stack import python_path, run_checked, wait_until
from bench.stats import CaseResult, Comparison
from worker.contract.settings import WorkerSettings

TURNS_WITH_TOOLS = 3
CALLS_PER_TURN = 2
BUSY_GOAL = 0.9
#: The orchestrator may spend at most this share of the workers' CPU on the same tool calls.
ORCHESTRATOR_CPU_GOAL = 0.6


def script() -> dict[str, Any]:
    calls = [{"name": "noop", "arguments": {}} for _ in range(CALLS_PER_TURN)]
    steps: list[dict[str, Any]] = [{"tool_calls": calls} for _ in range(TURNS_WITH_TOOLS)]
    return {"description": "bench: no-op calls", "steps": [*steps, {"content": "done"}]}


def _answers(port: int) -> bool:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
    try:
        connection.request("GET", "/stats")
        return connection.getresponse().status == 200
    except OSError:
        return False
    finally:
        connection.close()


def write_prompts(path: Path, count: int, prefix: str = "c") -> Path:
    """A batch's items at ``path``: ``count`` conversations that each say "go" to the script."""
    path.write_text(
        "".join(json.dumps({"id": f"{prefix}{n}", "prompt": "go"}) + "\n" for n in range(count))
    )
    return path


@contextlib.contextmanager
def scripted_model(steps: dict[str, Any] | None = None) -> Iterator[tuple[str, int]]:
    """``toolq scripted-llm`` playing ``steps`` (default: this case's script) on a free port;
    yields its base URL and pid."""
    with tempfile.TemporaryDirectory(prefix="toolq-bench-llm-") as folder:
        path = Path(folder) / "noop.json"
        path.write_text(json.dumps(steps or script()))
        port = free_port()
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "api.cli",
                "scripted-llm",
                "--port",
                str(port),
                "--script",
                str(path),
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            wait_until(lambda: _answers(port) or proc.poll() is not None, "scripted model")
            if proc.poll() is not None:
                raise RuntimeError(f"the scripted model exited with {proc.returncode}")
            yield f"http://127.0.0.1:{port}/v1", proc.pid
        finally:
            proc.terminate()
            proc.wait(10)


def run_module(settings: WorkerSettings, module: str, llm_url: str, *args: str) -> dict[str, Any]:
    """``python -m module --llm URL args...`` in a process of its own: its line of JSON, and
    how many model requests it had to retry."""
    env = {**os.environ, **worker_environment(settings), "PYTHONPATH": python_path()}
    argv = [sys.executable, "-m", module, "--llm", llm_url, *args]
    done = run_checked(argv, env, module, timeout=600)
    figures: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    # Retried model requests pass unseen in the answers but cost a request each.
    figures["model_requests_retried"] = done.stderr.count("model request failed")
    return figures


def run_orchestrator(settings: WorkerSettings, llm_url: str, conversations: int) -> dict[str, Any]:
    figures = run_module(
        settings, "bench.orchestrator", llm_url, "--conversations", str(conversations)
    )
    expected = conversations * TURNS_WITH_TOOLS * CALLS_PER_TURN
    if figures["tool_calls"] != expected or figures["tool_call_errors"]:
        raise RuntimeError(f"the conversations did not go as scripted: {figures}")
    return figures


def conversations_case(
    settings: WorkerSettings,
    stack: LocalStack,
    concurrency: int,
    bare_tasks_per_s: float,
    many: int,
    few: int,
    *,
    warm_up: bool = True,
) -> CaseResult:
    workers = stack.pids("worker-tools")
    client = redis.Redis.from_url(settings.redis_url)
    with scripted_model() as (llm_url, llm_pid):
        if warm_up:  # connections, the workers' first calls, the page cache
            run_orchestrator(settings, llm_url, few)
        small = run_orchestrator(settings, llm_url, few)
        llm_before = cpu_seconds(llm_pid)
        workers_before = sum(cpu_seconds(pid) for pid in workers)
        redis_before = redis_cpu_seconds(client)
        large = run_orchestrator(settings, llm_url, many)
        # As many requests as the large run asked the model.
        requests = many * (TURNS_WITH_TOOLS + 1)
        model_client = run_module(
            settings, "bench.model_client", llm_url, "--requests", str(requests)
        )
        cpu_s = {
            "orchestrator": large["cpu_s"],
            "workers": sum(cpu_seconds(pid) for pid in workers) - workers_before,
            "scripted model": cpu_seconds(llm_pid) - llm_before,
            "redis": redis_cpu_seconds(client) - redis_before,
        }
    client.close()
    calls_per_s = large["tool_calls"] / large["wall_s"]
    figures = {
        "worker_processes": concurrency,
        "turns_with_tool_calls": TURNS_WITH_TOOLS,
        "calls_per_turn": CALLS_PER_TURN,
        "tool_calls_per_s": round(calls_per_s, 1),
        "orchestrator_cpu_ms_per_tool_call": round(large["cpu_s"] * 1000 / large["tool_calls"], 3),
        "cpu_s_by_process": {name: round(seconds, 2) for name, seconds in cpu_s.items()},
        "bare_celery_tasks_per_s": bare_tasks_per_s,
        f"at_{few}": small,
        f"at_{many}": large,
        "model client": model_client,
    }
    result = CaseResult(
        key="conversations",
        title=f"3. The orchestrator: {many:,} conversations at once, {TURNS_WITH_TOOLS} turns "
        f"of {CALLS_PER_TURN} parallel no-op calls ({concurrency} worker processes)",
        figures=figures,
    )
    result.notes += [
        cpu_note(many, large["wall_s"], large["tool_calls"], cpu_s),
        ceiling_note(large["tool_calls"], cpu_s, bare_tasks_per_s),
        *orchestrator_notes(many, large),
        floors_note(large, model_client, cpu_s["workers"]),
    ]
    result.comparisons += [
        Comparison(
            metric=f"workers' busy fraction (calls/s vs bare Celery, {concurrency} processes)",
            value=round(calls_per_s, 1),
            baseline=bare_tasks_per_s,
            baseline_name="bare Celery throughput (case 2)",
            unit="calls/s",
            goal=BUSY_GOAL,
            higher_is_better=True,
        ),
        Comparison(
            metric="orchestrator CPU per tool call vs the workers'",
            value=round(cpu_s["orchestrator"] * 1000 / large["tool_calls"], 3),
            baseline=round(cpu_s["workers"] * 1000 / large["tool_calls"], 3),
            baseline_name="the workers' CPU per tool call, same calls",
            unit="ms",
            goal=ORCHESTRATOR_CPU_GOAL,
        ),
        Comparison(
            metric=f"orchestrator threads at {many:,} vs at {few} conversations",
            value=large["peak_threads"],
            baseline=small["peak_threads"],
            baseline_name=f"threads at {few} conversations",
            unit="threads",
            goal=1.0,
        ),
    ]
    return result


def cpu_note(conversations: int, wall_s: float, calls: int, cpu_s: dict[str, float]) -> str:
    """Who used the machine's CPU while the conversations ran, per tool call."""
    cores = len(os.sched_getaffinity(0))
    available = wall_s * cores
    shares = ", ".join(
        f"{name} {seconds:.1f} s ({seconds * 1000 / calls:.2f} ms/call, "
        f"{100 * seconds / available:.0f}%)"
        for name, seconds in cpu_s.items()
    )
    return (
        f"{conversations:,} conversations: {wall_s:.1f} s on {cores} cores "
        f"({available:.0f} CPU-seconds available); CPU used — {shares}."
    )


def ceiling_note(calls: int, cpu_s: dict[str, float], bare_tasks_per_s: float) -> str:
    """The most tool calls per second this machine could run, all its cores busy.

    Bare Celery's full load has no model to ask and a cheaper caller; here the workers share
    the cores with the orchestrator and the model server, which bounds the ratio however
    well each part does.
    """
    cores = len(os.sched_getaffinity(0))
    ms_per_call = sum(cpu_s.values()) * 1000 / calls
    ceiling = cores * 1000 / ms_per_call
    return (
        f"Every tool call of the conversations cost {ms_per_call:.2f} ms of CPU in all "
        f"processes together; with all {cores} cores busy the machine could run at most "
        f"{ceiling:.0f} calls/s, {ceiling / bare_tasks_per_s:.2f} of bare Celery's full-load "
        "rate: here the workers share the cores with the orchestrator and the model server, "
        "which bare Celery's full load does not have to run."
    )


def floors_note(run: dict[str, Any], model_client: dict[str, Any], workers_cpu_s: float) -> str:
    """What the orchestrator pays per tool call to the two libraries it talks through, each
    measured on its own: the openai client above aiohttp alone, and Celery's publish."""
    calls = run["tool_calls"]
    # Each conversation asks the model once per turn with tool calls, and once for its answer.
    requests_per_call = (TURNS_WITH_TOOLS + 1) / (TURNS_WITH_TOOLS * CALLS_PER_TURN)
    openai_ms = model_client["openai_cpu_ms_per_request"]
    aiohttp_ms = model_client["aiohttp_cpu_ms_per_request"]
    openai_share = (openai_ms - aiohttp_ms) * requests_per_call
    publish = run["cpu_ms_per_tool_call_in"].get(PUBLISH_PROBE, 0.0)
    workers = workers_cpu_s * 1000 / calls
    floor = openai_share + publish
    return (
        f"The model client, {model_client['requests']:,} chat requests on their own: "
        f"{openai_ms:.2f} ms of CPU per request through ChatModel (the openai client over "
        f"aiohttp), {aiohttp_ms:.2f} ms through aiohttp alone with the same body and JSON. "
        f"Per tool call ({requests_per_call:.2f} requests each here), the openai client's own "
        f"share is {openai_share:.2f} ms and Celery's publishing {publish:.2f} ms: together "
        f"{floor:.2f} ms, {floor / workers:.2f} of the workers' CPU per call, before toolq's "
        "agent loop, replies and asyncio add anything."
    )


def orchestrator_notes(conversations: int, run: dict[str, Any]) -> list[str]:
    """Where the orchestrator's CPU went, and where its extra threads came from."""
    per_call = run["cpu_s"] * 1000 / run["tool_calls"]
    probed: dict[str, float] = run["cpu_ms_per_tool_call_in"]
    rest = per_call - sum(probed.values())
    listed = "; ".join(f"{label} {ms:.2f} ms" for label, ms in probed.items())
    notes = [
        f"At {conversations:,} conversations the orchestrator used {per_call:.2f} ms of CPU per "
        f"tool call: {listed}; the rest ({rest:.2f} ms) is the model client's HTTP requests "
        "and responses (openai over aiohttp), the agent loop and asyncio. One process runs one "
        "thread of Python at a time, so it cannot do more than about "
        f"{1000 / per_call:.0f} tool calls/s however idle the workers are."
    ]
    ran = run["default_executor_runs"]
    extra = [n for n in run["thread_names_at_peak"] if n.startswith("asyncio")]
    if extra and "get_platform" in ran:
        notes.append(
            f"The orchestrator's threads beyond MainThread and toolq-send are asyncio's default "
            f"executor ({len(extra)} at {conversations:,} conversations), which ran only "
            f"{', '.join(f'{name} ({count} times)' for name, count in ran.items())}: the openai "
            "client detects the platform in a thread for every request sent before the first "
            "one has cached it. The pool stops at min(32, cores + 4) threads, but it does grow "
            "with the first burst of conversations. Filling the client's platform cache once "
            "when ChatModel is made (its _platform attribute, from openai's get_platform()) "
            "removes them."
        )
    return notes
