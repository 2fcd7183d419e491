"""Case 3's orchestrator: many conversations at once in a process of its own, so that its CPU
time, memory and threads are measured alone.

``python -m bench.orchestrator --llm URL --conversations N`` (settings from ``TOOLQ_*``) prints
one line of JSON.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import resource
import threading
import time
import uuid
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from openai._base_client import AsyncAPIClient

import api.model.body
from api.calls.dispatch import Dispatcher
from api.calls.fleet import load_fleet
from api.calls.publishing import CallPublisher
from api.conversation.agent import Agent, AgentOptions
from api.model.client import ChatModel
from api.process.gc_tuning import tuned_for_many_conversations
from api.settings import get_settings
from bench.probes import CpuProbe
from bench.procinfo import status_kb
from worker.plumbing.jobs.replies import ReplyReader

MODEL = "scripted"
PROMPT = "go"
SAMPLE_EVERY_S = 0.05
#: The probe of the calls' publishing: Celery's messages and their task-sent events.
PUBLISH_PROBE = "toolq publish (Celery messages, task-sent events)"


class ThreadWatch:
    """The most threads this process had while watched, and the Python names of its threads
    at that moment (the kernel calls them all "python")."""

    def __init__(self) -> None:
        self.peak = 0
        self.names: list[str] = []

    def sample(self) -> None:
        count = status_kb(os.getpid(), "Threads")
        if count > self.peak:
            self.peak = count
            self.names = sorted(thread.name for thread in threading.enumerate())

    async def watch(self) -> None:
        while True:
            self.sample()
            await asyncio.sleep(SAMPLE_EVERY_S)


class RecordingExecutor(ThreadPoolExecutor):
    """asyncio's default executor as asyncio makes it, counting what is run in its threads."""

    def __init__(self) -> None:
        super().__init__(thread_name_prefix="asyncio")
        self.functions: Counter[str] = Counter()

    def submit(self, fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        # run_in_executor wraps the function as partial(context.run, function, ...).
        target = fn.args[0] if isinstance(fn, functools.partial) and fn.args else fn
        self.functions[getattr(target, "__qualname__", repr(target))] += 1
        return super().submit(fn, *args, **kwargs)


def install_probes() -> list[CpuProbe]:
    """Where the orchestrator's CPU goes: the model client's request building, and publishing."""
    probes = [
        CpuProbe(api.model.body, "chat_body", "toolq chat request body"),
        CpuProbe(AsyncAPIClient, "_build_request", "openai request building"),
        CpuProbe(CallPublisher, "send", PUBLISH_PROBE),
        CpuProbe(ReplyReader, "deliver", "toolq reply parsing"),
    ]
    return [probe for probe in probes if probe.install()]


async def converse(llm_url: str, conversations: int) -> dict[str, Any]:
    probes = install_probes()
    executor = RecordingExecutor()
    asyncio.get_running_loop().set_default_executor(executor)
    settings = get_settings()
    fleet = load_fleet(settings.redis_url)
    # The model client as toolq's commands make it, pointed at the scripted model.
    os.environ["OPENAI_BASE_URL"] = llm_url
    os.environ["OPENAI_API_KEY"] = "unused"
    model = ChatModel.from_env(settings)
    threads = ThreadWatch()
    watcher = asyncio.create_task(threads.watch())
    rss_before_kb = status_kb(os.getpid(), "VmRSS")
    usage_before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    async with Dispatcher(settings) as dispatcher:
        batch = uuid.uuid4().hex[:8]
        agents = [
            Agent(
                model,
                AgentOptions(model=MODEL, run_id=f"conv-{batch}-{index}"),
                dispatcher=dispatcher,
                fleet=fleet,
                settings=settings,
            )
            for index in range(conversations)
        ]
        created = time.perf_counter()
        await asyncio.gather(*(agent.chat(PROMPT) for agent in agents))
    wall = time.perf_counter() - started
    usage_after = resource.getrusage(resource.RUSAGE_SELF)
    threads.sample()
    watcher.cancel()
    await model.aclose()
    records = [record for agent in agents for record in agent.tool_calls]
    cpu = (usage_after.ru_utime - usage_before.ru_utime) + (
        usage_after.ru_stime - usage_before.ru_stime
    )
    return {
        "conversations": conversations,
        "answered": sum(agent.stop_reason == "answered" for agent in agents),
        "tool_calls": len(records),
        "tool_call_errors": sum(record.is_error for record in records),
        "wall_s": round(wall, 3),
        "agent_creation_s": round(created - started, 3),
        "cpu_s": round(cpu, 3),
        "rss_before_mb": round(rss_before_kb / 1024, 1),
        "peak_rss_mb": round(usage_after.ru_maxrss / 1024, 1),
        "peak_threads": threads.peak,
        "thread_names_at_peak": threads.names,
        "default_executor_runs": dict(executor.functions),
        "cpu_ms_per_tool_call_in": {
            probe.label: round(probe.seconds * 1000 / max(len(records), 1), 3) for probe in probes
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.orchestrator")
    parser.add_argument("--llm", required=True, help="OpenAI base URL of the scripted model")
    parser.add_argument("--conversations", type=int, required=True)
    args = parser.parse_args()
    with tuned_for_many_conversations():  # as `toolq batch` runs its conversations
        print(json.dumps(asyncio.run(converse(args.llm, args.conversations))))


if __name__ == "__main__":
    main()
