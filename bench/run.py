"""``python -m bench.run [--quick] [--out DIR]``: every case, then the JSON, Markdown and plot.

It starts its own redis-server and workers; cases that fork or need no workers run first, while
this process has no threads yet.
"""

from __future__ import annotations

import argparse
import contextlib
import faulthandler
import os
import signal
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.agents_pool import agents_pool_case
from bench.batch_throughput import batch_throughput_case
from bench.big_output import big_output_case
from bench.conversations import conversations_case
from bench.images import images_case
from bench.real_items import FULL as REAL_FULL
from bench.real_items import QUICK as REAL_QUICK
from bench.real_items import RealSizes, real_items_case
from bench.report import machine, markdown, plot, write_json
from bench.round_trip import TOOLQ, round_trip_case
from bench.sandbox_cgroups import cgroup_case
from bench.sandbox_cost import NoopRoundTrips, sandbox_case
from bench.sandbox_layers import sandbox_layers
from bench.sandbox_parts import sandbox_parts
from bench.scaling import deploy_concurrency, instance_steps, measure_curve, measure_split
from bench.scaling_report import plot_scaling, scaling_case
from bench.search_tree import search_case
from bench.sessions import sessions_case
from bench.stack import bare_worker, bench_settings, private_redis, python_path, toolq_workers
from bench.stats import CaseResult
from bench.tasks import tasks_case
from bench.throughput import measure, throughput_case
from bench.viewer import viewer_case
from worker.contract.settings import WorkerSettings

RESULTS = Path(__file__).resolve().parent / "results"
WATCHDOG_S = 300


@dataclass(frozen=True)
class Sizes:
    round_trips: int
    warmup: int
    fast_calls: int
    throughput_calls: int
    throughput_warmup: int
    throughput_repeats: int
    conversations: int
    few_conversations: int
    conversation_warmup: bool
    conversation_workers: int
    agent_conversations: int
    agent_processes: tuple[int, ...]
    batch_conversations: int
    batch_repeats: int
    bash_calls: int
    cgroup_rounds: int
    big_output_bytes: int
    search_files: int
    search_runs: int
    worker_processes: tuple[int, ...]
    task_items: int
    task_repeats: int
    viewer_lines: int
    viewer_runs: int
    scaling_calls: int
    scaling_warmup: int
    scaling_repeats: int
    #: The most worker instances the scaling case runs; None: as many as the machine's cores.
    scaling_instances: int | None
    real_items: RealSizes


FULL = Sizes(
    round_trips=2000,
    warmup=200,
    fast_calls=5000,
    throughput_calls=5000,
    throughput_warmup=500,
    throughput_repeats=4,
    conversations=1000,
    few_conversations=10,
    conversation_warmup=True,
    conversation_workers=2,
    agent_conversations=2000,
    agent_processes=(1, 2),
    batch_conversations=300,
    batch_repeats=4,
    bash_calls=300,
    cgroup_rounds=3,
    big_output_bytes=1 << 30,
    search_files=10_000,
    search_runs=5,
    worker_processes=(1, 2),
    task_items=300,
    task_repeats=2,
    viewer_lines=100_000,
    viewer_runs=3,
    scaling_calls=2000,
    scaling_warmup=300,
    scaling_repeats=2,
    scaling_instances=None,
    real_items=REAL_FULL,
)
QUICK = Sizes(
    round_trips=30,
    warmup=5,
    fast_calls=100,
    throughput_calls=60,
    throughput_warmup=10,
    throughput_repeats=1,
    conversations=10,
    few_conversations=2,
    conversation_warmup=False,
    conversation_workers=1,
    agent_conversations=10,
    agent_processes=(1, 2),
    batch_conversations=10,
    batch_repeats=1,
    bash_calls=5,
    cgroup_rounds=1,
    big_output_bytes=4 << 20,
    search_files=200,
    search_runs=1,
    worker_processes=(1,),
    task_items=10,
    task_repeats=1,
    viewer_lines=2_000,
    viewer_runs=1,
    scaling_calls=30,
    scaling_warmup=5,
    scaling_repeats=1,
    scaling_instances=2,
    real_items=REAL_QUICK,
)


class Progress:
    """Says on stderr what runs, and keeps how long each step took."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    @contextlib.contextmanager
    def step(self, name: str) -> Iterator[None]:
        print(f"bench: {name} ...", file=sys.stderr, flush=True)
        # Armed per step: should one hang, its stack shows where; the run goes on.
        faulthandler.dump_traceback_later(WATCHDOG_S, repeat=True)
        started = time.monotonic()
        yield
        faulthandler.cancel_dump_traceback_later()
        self.seconds[name] = round(time.monotonic() - started, 1)
        print(f"bench: {name} took {self.seconds[name]} s", file=sys.stderr, flush=True)


def run_cases(sizes: Sizes, progress: Progress) -> list[CaseResult]:
    with progress.step("isolation layers"):
        layers = sandbox_layers(sizes.bash_calls, sizes.warmup)
    with progress.step("run_bash's parts"):
        parts = sandbox_parts(sizes.bash_calls, sizes.warmup)
    with progress.step("search_text vs grep"):
        search = search_case(sizes.search_files, sizes.search_runs)
    with progress.step("toolq view vs jq"):
        viewer = viewer_case(sizes.viewer_lines, sizes.viewer_runs)
    with progress.step("a run's container from an image"):
        images = images_case(max(3, sizes.bash_calls // 10), sizes.bash_calls)
    with progress.step("a bash_session call beside run_bash's"):
        sessions = sessions_case(sizes.bash_calls, sizes.warmup)
    by_concurrency: dict[int, dict[str, Any]] = {}
    with private_redis() as url, tempfile.TemporaryDirectory(prefix="toolq-bench-ws-") as ws:
        # Run folders belong to the sandbox user; it must be able to reach them.
        os.chmod(ws, 0o755)
        settings = bench_settings(url, Path(ws))
        for processes in sizes.worker_processes:
            pools = ("tools", "sandbox") if processes == 1 else ("tools",)
            with contextlib.ExitStack() as workers:
                with progress.step(f"starting workers of {processes} process(es)"):
                    stack = workers.enter_context(toolq_workers(settings, processes, pools))
                    bare = workers.enter_context(bare_worker(settings, processes))
                if processes == 1:
                    with progress.step("round trips"):
                        round_trip = round_trip_case(
                            settings, bare, sizes.round_trips, sizes.warmup, sizes.fast_calls
                        )
                    latency = round_trip.figures["latency"]
                    noop = NoopRoundTrips(
                        ready_p50_ms=latency[TOOLQ]["p50_ms"],
                        back_to_back_p50_ms=latency[f"{TOOLQ}, back to back"]["p50_ms"],
                    )
                    with progress.step("run_bash through the pool"):
                        sandbox = sandbox_case(
                            settings, layers, parts, noop, sizes.bash_calls, sizes.warmup
                        )
                    with progress.step("big output"):
                        big = big_output_case(settings, stack, sizes.big_output_bytes)
                    with progress.step("batch tasks"):
                        tasks = tasks_case(settings, sizes.task_items, sizes.task_repeats)
                with progress.step(f"throughput, {processes} process(es)"):
                    by_concurrency[processes] = measure(
                        settings,
                        stack,
                        bare,
                        sizes.throughput_calls,
                        sizes.throughput_warmup,
                        repeats=sizes.throughput_repeats,
                    )
                if processes == sizes.conversation_workers:
                    with progress.step("conversations"):
                        conversations = conversations_case(
                            settings,
                            stack,
                            processes,
                            by_concurrency[processes]["bare_tasks_per_s"],
                            sizes.conversations,
                            sizes.few_conversations,
                            warm_up=sizes.conversation_warmup,
                        )
                    with progress.step("conversations on the agents pool"):
                        agents = agents_pool_case(
                            settings,
                            stack.pids("worker-tools"),
                            sizes.agent_conversations,
                            sizes.agent_processes,
                        )
                    with progress.step("toolq batch vs bare Celery"):
                        batch = batch_throughput_case(
                            settings,
                            stack,
                            bare,
                            processes,
                            sizes.batch_conversations,
                            sizes.batch_repeats,
                        )
        # Pools of their own (tools and sandbox, two processes each) beside bare Celery's.
        with progress.step("real items vs bare Celery"):
            real = real_items_case(settings, sizes.real_items)
        # Sandbox workers of their own, one configuration at a time: no other may take the calls.
        with progress.step("run_bash with and without control groups"):
            cgroups = cgroup_case(settings, sizes.bash_calls, sizes.warmup, sizes.cgroup_rounds)
        scaling = run_scaling(settings, sizes, progress)
    throughput = throughput_case(by_concurrency, sizes.throughput_calls)
    return [
        round_trip,
        throughput,
        conversations,
        sandbox,
        big,
        search,
        tasks,
        viewer,
        cgroups,
        agents,
        scaling,
        images,
        sessions,
        batch,
        real,
    ]


def run_scaling(settings: WorkerSettings, sizes: Sizes, progress: Progress) -> CaseResult:
    """Case 11, on workers of its own once every other case's have stopped; prints the curve."""
    cores = len(os.sched_getaffinity(0))
    concurrency = deploy_concurrency()
    steps = instance_steps(cores, sizes.scaling_instances)
    runs = (sizes.scaling_calls, sizes.scaling_warmup, sizes.scaling_repeats)
    curve = measure_curve(settings, steps, concurrency, *runs, progress.step)
    with progress.step("scaling: the broker and the result store on a Redis each"):
        split = measure_split(settings, concurrency, *runs)
    case = scaling_case(curve, split, concurrency, sizes.scaling_calls, cores)
    print("\n".join(["bench: calls/s against worker instances:", *case.table]), file=sys.stderr)
    return case


def _stop_on_sigterm(signum: int, frame: object) -> None:
    # Unwinding runs every context manager: workers and redis-server are stopped, not orphaned.
    raise SystemExit(128 + signum)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves the harness")
    parser.add_argument("--out", type=Path, default=RESULTS, help="where the results go")
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, _stop_on_sigterm)
    os.environ["PYTHONPATH"] = python_path()
    sizes = QUICK if args.quick else FULL
    started = time.monotonic()
    meta: dict[str, Any] = {"machine": machine(), "quick": args.quick, "sizes": asdict(sizes)}
    progress = Progress()
    cases = run_cases(sizes, progress)
    meta["duration_s"] = round(time.monotonic() - started, 1)
    meta["seconds_by_step"] = progress.seconds
    meta["load_average_at_end"] = round(os.getloadavg()[0], 2)
    notes = [*load_notes(meta), *(note for case in cases for note in case.notes)]
    args.out.mkdir(parents=True, exist_ok=True)
    write_json(args.out / "latest.json", {**meta, "notes": notes}, cases)
    (args.out / "latest.md").write_text(markdown(meta, cases, notes))
    plot(args.out / "latency.png", cases)
    for case in cases:
        if case.key == "scaling":
            plot_scaling(args.out / case.image, case)
    failed = [c.metric for case in cases for c in case.comparisons if c.passed is False]
    missed = f": {'; '.join(failed)}" if failed else ""
    print(f"results in {args.out}; {len(failed)} goal(s) missed{missed}")
    return 0


def load_notes(meta: dict[str, Any]) -> list[str]:
    """A warning when other work shared the CPU: every figure is then slower and noisier."""
    cores = meta["machine"]["usable_cores"]
    start, end = meta["machine"]["load_average_at_start"], meta["load_average_at_end"]
    if max(start, end) < cores / 2:
        return []
    return [
        f"The machine was busy with other work (load average {start} at the start, {end} at "
        f"the end, on {cores} cores): latencies and throughputs are worse and noisier than on "
        "an idle machine; the CPU-per-call figures are the more reliable ones."
    ]


if __name__ == "__main__":
    sys.exit(main())
