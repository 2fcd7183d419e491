"""The real-items case's orchestrator (``bench.real_items``): a batch's items as ``toolq batch``
runs them, each a run of its own, its workspace removed (and so its uid let go) at its end, as
an Inspect sample's or an MCP session's is.

``python -m bench.real_items_driver --llm URL --items N`` (settings from ``TOOLQ_*``) runs the
``N`` items all at once through ``api.batch.runner`` and prints one line of JSON: the rate, the
process's CPU and where part of it went.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import os
import resource
import time
import uuid
from typing import Any

from api.batch.items import BatchItem
from api.batch.runner import run_item, run_items
from api.calls.dispatch import Dispatcher
from api.calls.fleet import load_fleet
from api.conversation.agent import Agent
from api.model.client import ChatModel
from api.process.gc_tuning import tuned_for_many_conversations
from api.runs.workspace import RunWorkspace, calls_end_within_s
from api.settings import get_settings
from bench.orchestrator import install_probes
from bench.probes import CpuProbe

MODEL = "scripted"
#: Names a file to write a cProfile of the run to (its pid appended), for looking into its CPU.
PROFILE_ENV = "BENCH_PROFILE_OUT"
#: The orchestrator's CPU in making a run's agent (its tools, its registry): a run's start here.
RUN_START_PROBE = "run start: Agent made (its tools)"


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def run_all(llm_url: str, count: int) -> dict[str, Any]:
    probes = install_probes()
    start_probe = CpuProbe(Agent, "__init__", RUN_START_PROBE)
    if start_probe.install():
        probes.append(start_probe)
    settings = get_settings()
    fleet = load_fleet(settings.redis_url).require_tools()
    os.environ["OPENAI_BASE_URL"] = llm_url
    os.environ["OPENAI_API_KEY"] = "unused"
    batch = uuid.uuid4().hex[:8]
    items = [BatchItem(id=f"i{n}", prompt="go") for n in range(count)]
    lines: list[dict[str, Any]] = []
    removed: list[bool] = []
    cpu_before = _cpu()
    started = time.perf_counter()
    async with Dispatcher(settings) as dispatcher, ChatModel.from_env(settings) as model:

        async def one(item: BatchItem) -> dict[str, Any]:
            run_id = f"real-{batch}-{item.id}"
            line = await run_item(
                item, model=model, dispatcher=dispatcher, fleet=fleet, settings=settings,
                run_id=run_id, default_model=MODEL, timeout_s=settings.conversation_timeout_s,
            )  # fmt: skip
            # The run's end: its workspace goes, and its uid with it.
            workspace = RunWorkspace(dispatcher, fleet, run_id)
            removed.append(await workspace.remove(wait_s=calls_end_within_s(settings)))
            return line

        await run_items(items, concurrency=count, runner=one, on_result=lines.append)
    wall = time.perf_counter() - started
    cpu = _cpu() - cpu_before
    calls = [call for line in lines for call in line["tool_calls"]]
    return {
        "items": count,
        "ok": sum(line["status"] == "ok" for line in lines),
        "errors": [line["error"] for line in lines if line["error"]][:3],
        "tool_calls": len(calls),
        "tool_call_errors": sum(bool(call.get("is_error")) for call in calls),
        "tool_call_error_outputs": [c["output"][:300] for c in calls if c.get("is_error")][:3],
        "tools": sorted({call["name"] for call in calls}),
        "workspaces_removed": sum(removed),
        "wall_s": round(wall, 4),
        "tool_calls_per_s": round(len(calls) / wall, 1),
        "cpu_s": round(cpu, 4),
        "cpu_s_in": {probe.label: round(probe.seconds, 4) for probe in probes},
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.real_items_driver")
    parser.add_argument("--llm", required=True, help="OpenAI base URL of the scripted model")
    parser.add_argument("--items", type=int, required=True)
    args = parser.parse_args()
    # Where a profile of the run is written (cProfile's format), when asked for.
    profile_to = os.environ.get(PROFILE_ENV)
    profiler = cProfile.Profile(time.process_time) if profile_to else None
    with tuned_for_many_conversations():  # as `toolq batch` runs its conversations
        if profiler is not None:
            profiler.enable()
        figures = asyncio.run(run_all(args.llm, args.items))
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile_to}.{os.getpid()}")
    print(json.dumps(figures))


if __name__ == "__main__":
    main()
