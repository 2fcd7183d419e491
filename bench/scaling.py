"""Case 11: tool calls/s against the number of worker instances, next to bare Celery with the
same instances, and the Redis server's CPU at each step.

A step of K runs K tools-pool instances (each ``celery -A worker.app worker -Q tools`` with the
concurrency the deploy gives it, ``TOOLQ_CONCURRENCY`` in deploy/k8s/worker-tools.yaml) and K
bare Celery instances of the same concurrency, all on one Redis, for K = 1, 2, 4, ... up to the
machine's cores. The load comes from K caller processes (``bench.load_caller``), one per
instance: a caller spends less CPU per call than an instance's consumer, so with a core each the
callers never set the pace. toolq's and bare Celery's runs alternate, as in case 2.

At each step the Redis server's main thread, which runs every command, is read from
``/proc/<pid>/task/<pid>/stat``: its CPU per call gives the rate at which it would be busy all
the time, the broker's ceiling. Once, with one instance, the broker and the result store are
two Redis servers (``TOOLQ_RESULT_BACKEND``), which tells each one's share: with RabbitMQ as the
broker, the result store's share is what stays on Redis.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

import redis
import yaml

from api.local.stack import LocalStack, worker_environment
from bench import load_caller
from bench.procinfo import cpu_seconds, process_tree, thread_cpu_seconds
from bench.stack import REPO, START_TIMEOUT_S, BareWorker, private_redis, toolq_workers
from worker.contract.settings import WorkerSettings

DEPLOY_TOOLS = REPO / "deploy" / "k8s" / "worker-tools.yaml"
TOOLQ = "toolq"
BARE = "bare Celery"


def deploy_concurrency(path: Path = DEPLOY_TOOLS) -> int:
    """The tools pool's ``TOOLQ_CONCURRENCY`` in the deploy's Deployment."""
    for document in yaml.safe_load_all(path.read_text()):
        if not document or document.get("kind") != "Deployment":
            continue
        for container in document["spec"]["template"]["spec"]["containers"]:
            for variable in container.get("env", []):
                if variable["name"] == "TOOLQ_CONCURRENCY":
                    return int(variable["value"])
    raise ValueError(f"{path} sets no TOOLQ_CONCURRENCY")


def instance_steps(cores: int, most: int | None = None) -> list[int]:
    """1, 2, 4, ... up to ``cores`` (and ``cores`` itself), at most ``most``."""
    bound = max(1, min(cores, most or cores))
    steps = [1]
    while steps[-1] * 2 <= bound:
        steps.append(steps[-1] * 2)
    if steps[-1] != bound:
        steps.append(bound)
    return steps


class RedisServerCpu:
    """The CPU time of a Redis server on this machine: its main thread, which runs every
    command (the one that saturates), and the whole process."""

    def __init__(self, url: str) -> None:
        client = redis.Redis.from_url(url)
        try:
            self.pid = int(client.info("server")["process_id"])
        finally:
            client.close()

    def main_thread(self) -> float:
        return thread_cpu_seconds(self.pid, self.pid)

    def process(self) -> float:
        return cpu_seconds(self.pid)


class LoadCallers:
    """The caller processes of one system, started as the steps need more of them."""

    def __init__(self, system: str, settings: WorkerSettings) -> None:
        self._system = system
        self._env = {**os.environ, **worker_environment(settings)}
        self._procs: list[subprocess.Popen[str]] = []
        self._logs: list[IO[str]] = []

    def grow(self, count: int) -> None:
        while len(self._procs) < count:
            # Kept open for the caller's lifetime, closed (and deleted) by ``close``.
            log = tempfile.NamedTemporaryFile("w+", prefix="toolq-bench-caller-")  # noqa: SIM115
            self._logs.append(log)
            self._procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.load_caller", self._system],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    text=True,
                    env=self._env,
                    start_new_session=True,
                )
            )

    def run(self, count: int, calls: int) -> list[dict[str, Any]]:
        """``calls`` sent by each of the first ``count`` callers at once; their reports."""
        used = self._procs[:count]
        for proc in used:
            assert proc.stdin is not None
            proc.stdin.write(f"{calls}\n")
            proc.stdin.flush()
        reports = []
        for index, proc in enumerate(used):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            if not line:
                self._logs[index].seek(0)
                raise RuntimeError(f"a {self._system} caller exited:\n{self._logs[index].read()}")
            report = json.loads(line)
            if report["failed"]:
                raise RuntimeError(f"{report['failed']} of {calls} no-op calls failed")
            reports.append(report)
        return reports

    def close(self) -> None:
        for proc in self._procs:
            assert proc.stdin is not None
            proc.stdin.close()
        for proc in self._procs:
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in self._logs:
            log.close()


class Instances:
    """Worker instances of both systems, started as the steps need more of them."""

    def __init__(
        self, settings: WorkerSettings, concurrency: int, stack: contextlib.ExitStack
    ) -> None:
        self._settings = settings
        self._concurrency = concurrency
        self._stack = stack
        self.toolq: list[LocalStack] = []
        self.bare: list[BareWorker] = []

    def grow(self, count: int) -> None:
        added: list[tuple[BareWorker, str]] = []
        host = socket.gethostname()
        # The bare instances start while toolq's do: each toolq instance is waited for in turn.
        while len(self.bare) < count:
            node = f"bare-{os.getpid()}-{len(self.bare)}@{host}"
            bare = BareWorker(self._settings, self._concurrency, node=node)
            self._stack.callback(bare.stop)
            self.bare.append(bare)
            added.append((bare, node))
        while len(self.toolq) < count:
            started = toolq_workers(self._settings, self._concurrency, ("tools",))
            self.toolq.append(self._stack.enter_context(started))
        for bare, node in added:
            _wait_for_node(bare, node)

    def pids(self, system: str, count: int) -> list[int]:
        if system == TOOLQ:
            return [pid for one in self.toolq[:count] for pid in one.pids("worker-tools")]
        return [pid for one in self.bare[:count] for pid in process_tree(one.proc.pid)]


def _wait_for_node(bare: BareWorker, node: str) -> None:
    """Every instance consumes before a step is measured: each answers a ping by its name."""
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if bare.proc.poll() is not None:
            raise RuntimeError(f"the bare Celery worker {node} exited")
        if bare.app.control.ping(destination=[node], timeout=1.0):
            return
    raise RuntimeError(f"the bare Celery worker {node} did not answer a ping")


def one_run(
    callers: LoadCallers,
    count: int,
    calls: int,
    redis_cpu: RedisServerCpu,
    worker_pids: Callable[[], list[int]],
) -> dict[str, float]:
    """``count`` callers of ``calls`` each: the rate, and where the CPU went."""
    pids = worker_pids()
    before = sum(map(cpu_seconds, pids)), redis_cpu.main_thread(), redis_cpu.process()
    began = time.monotonic()
    reports = callers.run(count, calls)
    wall = time.monotonic() - began
    workers = sum(map(cpu_seconds, pids)) - before[0]
    main, whole = redis_cpu.main_thread() - before[1], redis_cpu.process() - before[2]
    total = sum(r["calls"] for r in reports)
    elapsed = max(r["ended"] for r in reports) - min(r["started"] for r in reports)
    own = sum(r["cpu_s"] for r in reports)
    return {
        "calls_per_s": total / elapsed,
        "redis_main_thread_busy": main / wall,
        "redis_ms_per_call": main * 1000 / total,
        "cores_busy": (own + workers + whole) / wall,
        "callers_ms_per_call": own * 1000 / total,
        "workers_ms_per_call": workers * 1000 / total,
    }


def _mean(runs: list[dict[str, float]]) -> dict[str, float]:
    return {key: round(statistics.fmean(r[key] for r in runs), 3) for key in runs[0]}


def measure_step(
    count: int,
    callers: dict[str, LoadCallers],
    instances: Instances,
    redis_cpu: RedisServerCpu,
    calls: int,
    warmup: int,
    repeats: int,
) -> dict[str, Any]:
    """Both systems on ``count`` instances, alternating, after a warm-up run of each."""
    runs: dict[str, list[dict[str, float]]] = {TOOLQ: [], BARE: []}
    for system in runs:
        callers[system].grow(count)
        callers[system].run(count, warmup)
    for repeat in range(repeats):
        for system in (TOOLQ, BARE) if repeat % 2 == 0 else (BARE, TOOLQ):
            pids = functools.partial(instances.pids, system, count)
            runs[system].append(one_run(callers[system], count, calls, redis_cpu, pids))
    return {
        system: {**_mean(found), "runs_calls_per_s": [round(r["calls_per_s"], 1) for r in found]}
        for system, found in runs.items()
    }


@contextlib.contextmanager
def _callers(settings: WorkerSettings) -> Iterator[dict[str, LoadCallers]]:
    made = {
        TOOLQ: LoadCallers(load_caller.TOOLQ, settings),
        BARE: LoadCallers(load_caller.BARE, settings),
    }
    try:
        yield made
    finally:
        for callers in made.values():
            callers.close()


def measure_curve(
    settings: WorkerSettings,
    steps: list[int],
    concurrency: int,
    calls: int,
    warmup: int,
    repeats: int,
    progress: Callable[[str], contextlib.AbstractContextManager[None]],
) -> dict[int, dict[str, Any]]:
    """Every step's figures, the instances and callers of one step kept for the next."""
    redis_cpu = RedisServerCpu(settings.redis_url)
    curve: dict[int, dict[str, Any]] = {}
    with contextlib.ExitStack() as stack, _callers(settings) as callers:
        instances = Instances(settings, concurrency, stack)
        for count in steps:
            with progress(f"scaling: {count} instance(s) of concurrency {concurrency}"):
                instances.grow(count)
                curve[count] = measure_step(
                    count, callers, instances, redis_cpu, calls, warmup, repeats
                )
    return curve


def measure_split(
    settings: WorkerSettings, concurrency: int, calls: int, warmup: int, repeats: int
) -> dict[str, float]:
    """toolq on one instance with the broker and the result store on a Redis each: each
    server's main-thread CPU per call."""
    with private_redis() as broker_url, private_redis() as results_url:
        split = settings.model_copy(
            update={"broker_url": broker_url, "result_backend": results_url}
        )
        broker, results = RedisServerCpu(broker_url), RedisServerCpu(results_url)
        callers = LoadCallers(load_caller.TOOLQ, split)
        try:
            with toolq_workers(split, concurrency, ("tools",)):
                callers.grow(1)
                callers.run(1, warmup)
                found: list[dict[str, float]] = []
                for _ in range(repeats):
                    before = broker.main_thread(), results.main_thread()
                    report = callers.run(1, calls)[0]
                    after = broker.main_thread(), results.main_thread()
                    found.append(
                        {
                            "calls_per_s": calls / (report["ended"] - report["started"]),
                            "broker_redis_ms_per_call": (after[0] - before[0]) * 1000 / calls,
                            "results_redis_ms_per_call": (after[1] - before[1]) * 1000 / calls,
                        }
                    )
        finally:
            callers.close()
    return _mean(found)
