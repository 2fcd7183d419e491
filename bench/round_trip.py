"""Case 1: one tool call's round trip, one at a time, next to bare Celery, raw Redis, in process.

Also the parts of toolq's own round trip that can be timed in process, so a gap to bare Celery
can be put down to toolq's code or to the transport.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import read_manifest
from bench import redis_echo
from bench.noop_plugin import NoopTool
from bench.stack import TRANSPORT_NOTE, BareWorker, python_path
from bench.stats import CaseResult, Comparison, summarize
from worker.contract.fleet_secret import fleet_secret
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallRequest, ToolSpec
from worker.executor import Executor, build_registry
from worker.results import ResultStore
from worker.tools.registry import ToolRegistry

RUN_ID = "bench"
#: toolq's round trip p50 against a bare Celery task's, the worker ready.
P50_GOAL = 0.8
#: toolq's round trip p50 against a raw Redis LPUSH/BRPOP ping-pong's, same run: still a Celery
#: task, so never the floor itself.
FLOOR_GOAL = 3.0
TOOLQ = "toolq (Dispatcher)"
BARE = "bare Celery"
RAW_REDIS = "raw Redis ping-pong"
IN_PROCESS = "ToolRegistry.execute in process"
BLOCK = 50


class CountingConnection(redis.Connection):
    """Counts the commands sent on it in ``sent``, by name, whichever way they are sent (the
    client's command path, or a script's call written straight on the connection)."""

    def __init__(self, *args: Any, sent: Counter[str], **kwargs: Any) -> None:
        self.sent = sent
        super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    def send_command(self, *args: Any, **kwargs: Any) -> None:
        self.sent[str(args[0])] += 1
        super().send_command(*args, **kwargs)  # type: ignore[no-untyped-call]


class CountingRedis(redis.Redis):
    """Counts the commands it sends, by name: each is one round trip (no pipelines here)."""

    def __init__(self, url: str) -> None:
        self.sent: Counter[str] = Counter()
        pool = redis.ConnectionPool.from_url(
            url, connection_class=CountingConnection, sent=self.sent
        )
        super().__init__(connection_pool=pool)


def noop_spec(settings: WorkerSettings) -> ToolSpec:
    client = redis.Redis.from_url(settings.redis_url)
    try:
        return read_manifest(client)["noop"]
    finally:
        client.close()


async def noop_burst(dispatcher: Dispatcher, spec: ToolSpec, calls: int) -> int:
    """Send ``calls`` no-op calls at once and wait for every answer; how many failed."""

    async def one() -> bool:
        request = dispatcher.build_request(
            spec, task_id=uuid.uuid4().hex, run_id=RUN_ID, arguments={}
        )
        return not (await dispatcher.call(request, spec.pool)).is_error

    answers = await asyncio.gather(*(one() for _ in range(calls)))
    return answers.count(False)


class WorkersReady:
    """Waits until every worker is back to waiting for work (its consumer blocked in BRPOP).

    A worker of concurrency 1 acknowledges a task, sends its events and asks for the next
    message after the task has answered: a call sent the moment the previous answer arrives
    waits for that too. Agents send their next call after a model turn, by which time the
    worker is waiting; this is how the "worker ready" round trips are sent.
    """

    def __init__(self, url: str) -> None:
        self._client = redis.Redis.from_url(url)
        self.idle = 0
        self.gave_up = 0

    def waiting(self) -> int:
        clients = self._client.client_list()
        return sum(1 for c in clients if c.get("cmd") == "brpop" and "b" in c.get("flags", ""))

    def learn(self) -> None:
        """How many consumers wait when nothing runs (a consumer re-issues BRPOP each second,
        so the most seen over a few looks)."""
        self.idle = max(self.waiting() for _ in range(20))

    def wait(self, bound_s: float = 2.0) -> None:
        deadline = time.monotonic() + bound_s
        while self.waiting() < self.idle:
            if time.monotonic() > deadline:
                self.gave_up += 1
                return

    def close(self) -> None:
        self._client.close()


async def interleaved_round_trips(
    settings: WorkerSettings,
    bare: BareWorker,
    calls: int,
    warmup: int,
    ready: WorkersReady | None = None,
) -> tuple[list[float], list[float]]:
    """Milliseconds per call of toolq (``build_request`` then ``call``) and of bare Celery
    (``apply_async().get()``), one call at a time, in alternating blocks: a burst of other work
    on the machine then hits both alike. With ``ready``, each call is sent once the workers
    wait for work again."""
    spec = noop_spec(settings)
    toolq: list[float] = []
    baseline: list[float] = []
    async with Dispatcher(settings) as dispatcher:

        async def one_toolq() -> float:
            if ready is not None:
                ready.wait()
            started = time.perf_counter()
            request = dispatcher.build_request(
                spec, task_id=uuid.uuid4().hex, run_id=RUN_ID, arguments={}
            )
            result = await dispatcher.call(request, spec.pool)
            if result.is_error:
                raise RuntimeError(f"the noop call failed: {result.output}")
            return (time.perf_counter() - started) * 1000

        def one_baseline() -> float:
            if ready is not None:
                ready.wait()
            return one_bare(bare)

        for _ in range(warmup):
            await one_toolq()
            one_baseline()
        while len(toolq) < calls:
            block = min(BLOCK, calls - len(toolq))
            toolq += [await one_toolq() for _ in range(block)]
            # Blocking the loop is harmless here: no toolq call is waiting meanwhile.
            baseline += [one_baseline() for _ in range(block)]
    return toolq, baseline


def one_bare(bare: BareWorker) -> float:
    started = time.perf_counter()
    bare.task.apply_async().get(timeout=30)
    return (time.perf_counter() - started) * 1000


def raw_redis_round_trips(url: str, calls: int, warmup: int) -> list[float]:
    """LPUSH to another process and BRPOP its answer: the least any Redis queue can cost."""
    client = redis.Redis.from_url(url)
    client.delete(redis_echo.PING_KEY, redis_echo.PONG_KEY)
    echo = subprocess.Popen(
        [sys.executable, "-m", "bench.redis_echo", url],
        env={"PYTHONPATH": python_path(), "PATH": "/usr/bin:/bin"},
    )
    samples: list[float] = []
    try:
        for index in range(warmup + calls):
            started = time.perf_counter()
            client.lpush(redis_echo.PING_KEY, b"x")
            if client.brpop([redis_echo.PONG_KEY], timeout=30) is None:
                raise RuntimeError("the Redis echo process did not answer")
            elapsed = (time.perf_counter() - started) * 1000
            if index >= warmup:
                samples.append(elapsed)
        client.lpush(redis_echo.PING_KEY, redis_echo.STOP)
        echo.wait(10)
    finally:
        if echo.poll() is None:
            echo.kill()
            echo.wait()
        client.close()
    return samples


async def in_process_calls(calls: int, warmup: int, *, sync_in_thread: bool) -> list[float]:
    registry = ToolRegistry(sync_in_thread=sync_in_thread)
    registry.register(NoopTool())
    samples: list[float] = []
    for index in range(warmup + calls):
        started = time.perf_counter()
        await registry.execute("noop", {})
        elapsed = (time.perf_counter() - started) * 1000
        if index >= warmup:
            samples.append(elapsed)
    return samples


def _timed(action: Callable[[], object], calls: int) -> float:
    """Mean milliseconds of ``action()`` after a few warm-up runs."""
    for _ in range(min(calls, 20)):
        action()
    started = time.perf_counter()
    for _ in range(calls):
        action()
    return round((time.perf_counter() - started) * 1000 / calls, 4)


def toolq_parts(settings: WorkerSettings, spec: ToolSpec, calls: int) -> dict[str, Any]:
    """Mean ms of the pieces of a toolq call that run in process, with the bench Redis."""
    dispatcher = Dispatcher(settings)
    with tempfile.TemporaryDirectory(prefix="toolq-bench-parts-") as root:
        run_settings = settings.model_copy(update={"workspace_root": Path(root)})
        client = CountingRedis(settings.redis_url)
        store = ResultStore(client, 60, fleet_secret(settings.fleet_secret_file))
        executor = Executor(run_settings, store, "bench:parts")
        reply_key = f"bench:parts:{uuid.uuid4().hex}"

        def request() -> ToolCallRequest:
            request = dispatcher.build_request(
                spec, task_id=uuid.uuid4().hex, run_id=RUN_ID, arguments={}
            )
            return request.model_copy(update={"reply_to": reply_key})

        def handle() -> None:
            executor.handle(request().model_dump(mode="json"), "tools")

        client.sent.clear()
        handle_ms = _timed(handle, calls)
        handled = calls + min(calls, 20)
        per_handle = {
            name.lower(): round(count / handled, 2) for name, count in client.sent.items()
        }
        parts: dict[str, Any] = {
            "build_request + JSON body (caller)": _timed(
                lambda: request().model_dump(mode="json"), calls
            ),
            "build_registry, once per process (worker)": _timed(
                lambda: build_registry(run_settings), 20
            ),
            "Executor.handle incl. its Redis round trips (worker)": handle_ms,
            "one Redis GET round trip": _timed(lambda: client.get("bench:nothing"), calls),
            "Redis round trips per Executor.handle": per_handle,
        }
        client.delete(reply_key)
        client.close()
    return parts


def round_trip_case(
    settings: WorkerSettings, bare: BareWorker, calls: int, warmup: int, fast_calls: int
) -> CaseResult:
    """Run the four round trips, then time toolq's parts; needs workers of concurrency 1."""
    toolq_next, baseline_next = asyncio.run(interleaved_round_trips(settings, bare, calls, warmup))
    ready = WorkersReady(settings.redis_url)
    ready.learn()
    toolq, baseline = asyncio.run(interleaved_round_trips(settings, bare, calls, 0, ready))
    ready.close()
    raw = raw_redis_round_trips(settings.redis_url, fast_calls, warmup)
    direct = asyncio.run(in_process_calls(fast_calls, warmup, sync_in_thread=False))
    threaded = asyncio.run(in_process_calls(fast_calls, warmup, sync_in_thread=True))
    parts = toolq_parts(settings, noop_spec(settings), max(calls // 4, 20))
    result = CaseResult(
        key="round_trip",
        title="1. One tool call's round trip, sequential (worker concurrency 1)",
        samples_ms={TOOLQ: toolq, BARE: baseline, RAW_REDIS: raw, IN_PROCESS: direct},
    )
    stats = {
        TOOLQ: summarize(toolq),
        BARE: summarize(baseline),
        f"{TOOLQ}, back to back": summarize(toolq_next),
        f"{BARE}, back to back": summarize(baseline_next),
        RAW_REDIS: summarize(raw),
        IN_PROCESS: summarize(direct),
        f"{IN_PROCESS}, sync tool in a thread": summarize(threaded),
    }
    result.figures = {
        "latency": stats,
        "toolq_parts_mean_ms": parts,
        "worker_ready_waits_given_up": ready.gave_up,
        "consumers_waiting_when_idle": ready.idle,
    }
    result.notes += [parts_note(parts), BACK_TO_BACK_NOTE, TRANSPORT_NOTE]
    for pct, goal in (("p50", P50_GOAL), ("p95", None), ("p99", 1.2)):
        result.comparisons.append(
            Comparison(
                metric=f"round trip {pct}, worker ready",
                value=stats[TOOLQ][f"{pct}_ms"],
                baseline=stats[BARE][f"{pct}_ms"],
                baseline_name=BARE,
                unit="ms",
                goal=goal,
            )
        )
    for pct in ("p50", "p99"):
        result.comparisons.append(
            Comparison(
                metric=f"round trip {pct}, back to back",
                value=stats[f"{TOOLQ}, back to back"][f"{pct}_ms"],
                baseline=stats[f"{BARE}, back to back"][f"{pct}_ms"],
                baseline_name=BARE,
                unit="ms",
            )
        )
    result.comparisons.append(
        Comparison(
            metric="round trip p50 vs the floor",
            value=stats[TOOLQ]["p50_ms"],
            baseline=stats[RAW_REDIS]["p50_ms"],
            baseline_name=RAW_REDIS,
            unit="ms",
            goal=FLOOR_GOAL,
        )
    )
    return result


def parts_note(parts: dict[str, Any]) -> str:
    commands: dict[str, float] = parts["Redis round trips per Executor.handle"]
    listed = ", ".join(f"{name} {count:g}" for name, count in commands.items())
    return (
        f"In process, toolq's worker side (Executor.handle) takes "
        f"{parts['Executor.handle incl. its Redis round trips (worker)']:.3f} ms per no-op call, "
        f"with {sum(commands.values()):g} Redis round trips ({listed}) at about "
        f"{parts['one Redis GET round trip']:.3f} ms each; a bare Celery task stores its result "
        "with one pipelined round trip (SETEX + PUBLISH). The caller's build_request costs "
        f"{parts['build_request + JSON body (caller)']:.3f} ms; the registry, built once per "
        f"worker process, {parts['build_registry, once per process (worker)']:.3f} ms."
        + (PRE_RUN_TRIPS if {"get", "set"} <= set(commands) else "")
    )


BACK_TO_BACK_NOTE = (
    'Two ways of sending calls one at a time. "Worker ready": each call goes once every '
    "worker waits for work again, as an agent's next call comes after a model turn. \"Back "
    'to back": each call goes the moment the previous answer arrives. A worker of concurrency '
    "1 acknowledges a task, sends its events and asks for the next message only after the "
    "task has answered, so back to back each call also waits for the end of that work on the "
    "previous one; toolq's answer arrives earlier (the worker pushes it to the caller's list "
    "while Celery's result still travels through its backend and pub/sub), so more of that "
    "wait falls on toolq's next call."
)


PRE_RUN_TRIPS = (
    " Two of those round trips come before the tool runs (GET of a stored result, SET NX of "
    "the start marker); for an idempotent tool neither is needed (the store-once script "
    "already keeps the first answer), and for the others the GET is needed only when the SET "
    "NX finds a marker: worker/executor.py could skip both for idempotent tools and read the "
    "stored result only on a marker conflict."
)
