"""Case 14: a batch of real items at the engine's speed. Items of ``toolq batch`` that call the
built-in tools, each a run with a workspace and a uid of its own, let go at its end; against bare
Celery's no-op tasks on as many worker processes, in the same run.

Each item is a conversation of three turns with the scripted model: ``write_file`` and
``list_dir``, then ``read_file`` and ``search_files``, then the answer; then its workspace is
removed, and its uid let go (``bench.real_items_driver``). The tools and the sandbox pools run two
processes each, bare Celery's worker two. The two alternate, round by round, and the ratio is the
median of the rounds' ratios. The CPU every process spent is read per call, and in the tools
pool's processes per step of a run (``bench.step_probes``).

``python -m bench.real_items [--quick] [--items N] [--rounds R]`` runs this case alone, on a
Redis and workers of its own, and prints its figures as JSON and its notes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis

from api.local.stack import LocalStack
from bench import step_probes
from bench.conversations import run_module, scripted_model
from bench.cost import redis_cpu_seconds
from bench.procinfo import cpu_seconds, process_tree
from bench.real_items_report import real_items_result
from bench.stack import PLUGIN, BareWorker, bench_settings, private_redis, python_path
from bench.stats import CaseResult
from bench.throughput import bare_throughput
from worker.contract.settings import WorkerSettings

PROCESSES = 2
POOLS = ("tools", "sandbox")
CALLS_PER_ITEM = 4
NOTE_TEXT = "Notes of item {n}: the engine at work.\n"
#: How long the tools pool's processes may take to write their last sums after a round.
PROBES_SETTLE_S = 10.0


@dataclass(frozen=True)
class RealSizes:
    items: int
    rounds: int
    warmup_items: int


FULL = RealSizes(items=300, rounds=6, warmup_items=20)
QUICK = RealSizes(items=4, rounds=1, warmup_items=2)


def script() -> dict[str, Any]:
    """The scripted model's three turns: a file written and the folder listed, the file read
    back and found by a glob, then the answer."""
    first = [
        {"name": "write_file", "arguments": {"path": "notes.txt", "content": NOTE_TEXT}},
        {"name": "list_dir", "arguments": {"path": "."}},
    ]
    second = [
        {"name": "read_file", "arguments": {"path": "notes.txt"}},
        {"name": "search_files", "arguments": {"pattern": "*.txt"}},
    ]
    return {
        "description": "bench: real items",
        "steps": [{"tool_calls": first}, {"tool_calls": second}, {"content": "done"}],
    }


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _cpu_by_process(named: dict[str, list[int]]) -> dict[str, float]:
    """Each pool's consumer (its main process) and its processes, by name."""
    cpu: dict[str, float] = {}
    for name, pids in named.items():
        cpu[f"{name} consumer"] = cpu_seconds(pids[0])
        for n, pid in enumerate(sorted(pids[1:]), 1):
            cpu[f"{name} process {n}"] = cpu_seconds(pid)
    return cpu


def _less(after: dict[str, float], before: dict[str, float]) -> dict[str, float]:
    return {name: seconds - before.get(name, 0.0) for name, seconds in after.items()}


@dataclass
class Fleet:
    """What a round runs against: the settings, toolq's pools, bare Celery, the model."""

    settings: WorkerSettings
    stack: LocalStack
    bare: BareWorker
    llm_url: str
    llm_pid: int
    probes: Path

    def pools(self) -> dict[str, list[int]]:
        return {f"{pool} pool": self.stack.pids(f"worker-{pool}") for pool in POOLS}

    def run_toolq(self, items: int) -> dict[str, Any]:
        """One batch of ``items``: its rate, and every process's CPU and the tools pool's steps
        over it."""
        client = redis.Redis.from_url(self.settings.redis_url)
        named = self.pools()
        before = _cpu_by_process(named) | {
            "scripted model": cpu_seconds(self.llm_pid),
            "redis": redis_cpu_seconds(client),
        }
        steps_before = step_probes.read_sums(self.probes)
        run = run_module(
            self.settings, "bench.real_items_driver", self.llm_url, "--items", str(items)
        )
        after = _cpu_by_process(named) | {
            "scripted model": cpu_seconds(self.llm_pid),
            "redis": redis_cpu_seconds(client),
        }
        client.close()
        expected = items * CALLS_PER_ITEM
        # A call the loaded machine answered late is reported (``real_items_report``), not a
        # reason to throw the round away; an item that did not run to its answer is.
        if run["tool_calls"] != expected or run["ok"] != items:
            raise RuntimeError(f"the items did not go as scripted: {run}")
        # Every call the tools pool answered, the removals too, is in the sums once written.
        handled = items * (CALLS_PER_ITEM + 1)
        steps = self._settled_steps(steps_before, handled)
        cpu = {"orchestrator": run["cpu_s"], **_less(after, before)}
        return {"rate": run["tool_calls_per_s"], "run": run, "cpu_s": cpu, "steps": steps}

    def _settled_steps(
        self, before: dict[int, dict[str, tuple[float, int]]], handled: int
    ) -> dict[str, tuple[float, int]]:
        deadline = time.monotonic() + PROBES_SETTLE_S
        while True:
            steps = step_probes.difference(step_probes.read_sums(self.probes), before)
            if steps.get(step_probes.CALL, (0.0, 0))[1] >= handled:
                return steps
            if time.monotonic() > deadline:
                raise RuntimeError(f"the tools pool's step sums stopped short: {steps}")
            time.sleep(0.05)

    def run_bare(self, calls: int) -> dict[str, Any]:
        """``calls`` no-op tasks in flight: the rate, and every process's CPU over it."""
        client = redis.Redis.from_url(self.settings.redis_url)
        named = {"bare Celery": process_tree(self.bare.proc.pid)}
        before = _cpu_by_process(named) | {"caller": _own_cpu(), "redis": redis_cpu_seconds(client)}
        rate = bare_throughput(self.bare, calls)
        after = _cpu_by_process(named) | {"caller": _own_cpu(), "redis": redis_cpu_seconds(client)}
        client.close()
        return {"rate": rate, "cpu_s": _less(after, before)}


@contextlib.contextmanager
def real_fleet(settings: WorkerSettings) -> Iterator[Fleet]:
    """Tools and sandbox pools of ``PROCESSES`` each with the step probes, bare Celery's worker
    of as many, and the scripted model playing this case's script."""
    with contextlib.ExitStack() as stack:
        probes = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="toolq-probes-")))
        os.environ[step_probes.FOLDER_ENV] = str(probes)
        stack.callback(os.environ.pop, step_probes.FOLDER_ENV, None)
        os.environ["PYTHONPATH"] = python_path()
        toolq = LocalStack(
            settings, plugins=[PLUGIN, step_probes.__name__], concurrency=PROCESSES, pools=POOLS
        )
        stack.callback(toolq.stop)
        toolq.start_workers(settings)
        bare = BareWorker(settings, PROCESSES)
        stack.callback(bare.stop)
        bare.wait_ready()
        llm_url, llm_pid = stack.enter_context(scripted_model(script()))
        yield Fleet(toolq.settings, toolq, bare, llm_url, llm_pid, probes)


def measure_rounds(fleet: Fleet, sizes: RealSizes) -> dict[str, list[dict[str, Any]]]:
    """Warm-ups of both, then ``sizes.rounds`` rounds, alternating which goes first."""
    calls = sizes.items * CALLS_PER_ITEM
    fleet.run_toolq(sizes.warmup_items)
    fleet.run_bare(min(calls, 300))
    rounds: dict[str, list[dict[str, Any]]] = {"toolq": [], "bare": []}
    for number in range(sizes.rounds):
        for which in ("bare", "toolq") if number % 2 == 0 else ("toolq", "bare"):
            if which == "bare":
                rounds["bare"].append(fleet.run_bare(calls))
            else:
                rounds["toolq"].append(fleet.run_toolq(sizes.items))
    return rounds


def real_items_case(settings: WorkerSettings, sizes: RealSizes) -> CaseResult:
    with real_fleet(settings) as fleet:
        rounds = measure_rounds(fleet, sizes)
    return real_items_result(sizes.items, CALLS_PER_ITEM, PROCESSES, rounds)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.real_items", description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny sizes: proves the harness")
    parser.add_argument("--items", type=int, help="items per batch")
    parser.add_argument("--rounds", type=int, help="alternated rounds")
    args = parser.parse_args(argv)
    sizes = QUICK if args.quick else FULL
    sizes = RealSizes(
        items=args.items or sizes.items,
        rounds=args.rounds or sizes.rounds,
        warmup_items=sizes.warmup_items,
    )
    os.environ["PYTHONPATH"] = python_path()
    with private_redis() as url, tempfile.TemporaryDirectory(prefix="toolq-bench-ws-") as ws:
        os.chmod(ws, 0o755)  # run folders belong to the runs' uids: they must reach them
        case = real_items_case(bench_settings(url, Path(ws)), sizes)
    print(json.dumps(case.as_dict(), indent=2))
    print("\n".join(case.table), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
