"""Case 4: run_bash ``true`` through the sandbox pool next to ``subprocess.run``, the cost of
each isolation mode of ``worker.sandbox`` measured in process (see ``bench.sandbox_layers``), and
the parts of a call of the pool's configuration (see ``bench.sandbox_parts``)."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass

import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import read_manifest
from bench.round_trip import RUN_ID, WorkersReady
from bench.sandbox_layers import COMMAND, SHELL_ONLY, LayerTimings
from bench.sandbox_parts import IN_PROCESS, PAUSE_S, SandboxParts, parts_note
from bench.stats import CaseResult, Comparison, percentile, summarize
from worker.contract.settings import WorkerSettings

OVERHEAD_GOAL_MS = 2.0
#: run_bash through the pool may cost at most this many bare shells above a no-op round trip.
POOL_COST_GOAL = 3.0
POOL = "run_bash 'true' through the sandbox pool"
POOL_BACK_TO_BACK = f"{POOL}, back to back"
POOL_PAUSED = f"{POOL}, after a pause of {PAUSE_S * 1000:.0f} ms"
NOOP_PAUSED = f"the no-op through the tools pool, after a pause of {PAUSE_S * 1000:.0f} ms"


async def pool_timings(
    settings: WorkerSettings, calls: int, warmup: int, ready: WorkersReady | None = None
) -> tuple[list[float], list[str]]:
    """run_bash 'true' round trips through the sandbox pool, and the layers the pool used; with
    ``ready``, each sent once the workers wait for work again (as the no-op's round trips)."""
    client = redis.Redis.from_url(settings.redis_url)
    spec = read_manifest(client)["run_bash"]
    client.close()
    samples: list[float] = []
    layers: list[str] = []
    async with Dispatcher(settings) as dispatcher:
        for index in range(warmup + calls):
            if ready is not None:
                ready.wait()
            started = time.perf_counter()
            request = dispatcher.build_request(
                spec, task_id=uuid.uuid4().hex, run_id=RUN_ID, arguments={"command": COMMAND}
            )
            result = await dispatcher.call(request, spec.pool)
            elapsed = (time.perf_counter() - started) * 1000
            if result.is_error or json.loads(result.output)["exit_code"] != 0:
                raise RuntimeError(f"run_bash 'true' failed: {result.output}")
            layers = json.loads(result.output)["isolation"]
            if index >= warmup:
                samples.append(elapsed)
    return samples, layers


async def paused_timings(
    settings: WorkerSettings, calls: int, warmup: int
) -> tuple[list[float], list[float]]:
    """run_bash 'true' and the no-op in turns, each sent ``PAUSE_S`` after the previous answer,
    as an agent's next call follows a model turn: the workers' work between calls is done."""
    client = redis.Redis.from_url(settings.redis_url)
    specs = read_manifest(client)
    client.close()
    bash: list[float] = []
    noop: list[float] = []
    async with Dispatcher(settings) as dispatcher:

        async def timed(tool: str, arguments: dict[str, str]) -> tuple[float, str]:
            await asyncio.sleep(PAUSE_S)
            started = time.perf_counter()
            request = dispatcher.build_request(
                specs[tool], task_id=uuid.uuid4().hex, run_id=RUN_ID, arguments=arguments
            )
            result = await dispatcher.call(request, specs[tool].pool)
            if result.is_error:
                raise RuntimeError(f"{tool} failed: {result.output}")
            return (time.perf_counter() - started) * 1000, result.output

        for index in range(warmup + calls):
            bash_ms, output = await timed("run_bash", {"command": COMMAND})
            if json.loads(output)["exit_code"] != 0:
                raise RuntimeError(f"run_bash 'true' failed: {output}")
            noop_ms, _ = await timed("noop", {})
            if index >= warmup:
                bash.append(bash_ms)
                noop.append(noop_ms)
    return bash, noop


@dataclass(frozen=True)
class NoopRoundTrips:
    """The no-op's round trip p50s from case 1: the floor run_bash's pool cost is taken above."""

    ready_p50_ms: float
    back_to_back_p50_ms: float


def sandbox_case(
    settings: WorkerSettings,
    layers: LayerTimings,
    parts: SandboxParts,
    noop: NoopRoundTrips,
    calls: int,
    warmup: int,
) -> CaseResult:
    ready = WorkersReady(settings.redis_url)
    ready.learn()
    pool, pool_layers = asyncio.run(pool_timings(settings, calls, warmup, ready))
    ready.close()
    back_to_back, _ = asyncio.run(pool_timings(settings, calls, warmup))
    paused, noop_paused = asyncio.run(paused_timings(settings, calls, warmup))
    samples = {
        POOL: pool,
        POOL_BACK_TO_BACK: back_to_back,
        POOL_PAUSED: paused,
        NOOP_PAUSED: noop_paused,
        **layers.samples,
    }
    stats = {name: summarize(values) for name, values in samples.items()}
    shell_p50 = stats[SHELL_ONLY]["p50_ms"]
    above_noop = round(stats[POOL]["p50_ms"] - noop.ready_p50_ms, 3)
    above_noop_back_to_back = round(
        stats[POOL_BACK_TO_BACK]["p50_ms"] - noop.back_to_back_p50_ms, 3
    )
    above_noop_paused = round(stats[POOL_PAUSED]["p50_ms"] - stats[NOOP_PAUSED]["p50_ms"], 3)
    result = CaseResult(
        key="run_bash",
        title="4. run_bash 'true': the sandbox pool and each isolation mode",
        figures={
            "latency": stats,
            "modes_unavailable": layers.unavailable,
            "pool_isolation_layers": pool_layers,
            "noop_round_trip_p50_ms": asdict(noop),
            "pool_p50_minus_noop_round_trip_ms": {
                "worker ready": above_noop,
                "back to back": above_noop_back_to_back,
                "after a pause": above_noop_paused,
            },
            "worker_ready_waits_given_up": ready.gave_up,
            "p50_over_bare_shell_ms": {
                name: round(s["p50_ms"] - shell_p50, 3)
                for name, s in stats.items()
                if name not in (SHELL_ONLY, POOL, POOL_BACK_TO_BACK, POOL_PAUSED, NOOP_PAUSED)
            },
        },
        samples_ms=samples,
    )
    result.notes.append(POOL_MODES_NOTE)
    parts_p50 = {name: round(percentile(v, 50), 3) for name, v in parts.samples.items()}
    result.figures["parts_p50_ms"] = parts_p50
    result.figures["parts_unavailable"] = parts.unavailable
    if IN_PROCESS in parts_p50 and SHELL_ONLY in parts_p50:
        result.notes.append(parts_note(parts_p50, noop.ready_p50_ms, above_noop))
        result.comparisons.append(
            Comparison(
                metric="run_bash 'true' in process, the pool's configuration (p50)",
                value=parts_p50[IN_PROCESS],
                baseline=parts_p50[SHELL_ONLY],
                baseline_name=f"{SHELL_ONLY}, in the same turns",
                unit="ms",
            )
        )
    if layers.plumbing is not None:
        sandboxed, same_line = layers.plumbing
        result.comparisons += [
            Comparison(
                metric="run_bash's own overhead, before isolation (p50, in process)",
                value=stats[sandboxed]["p50_ms"],
                baseline=stats[same_line]["p50_ms"],
                baseline_name="subprocess.run of the same wrapped command line",
                unit="ms",
                goal=OVERHEAD_GOAL_MS,
                goal_on="difference",
            ),
            Comparison(
                metric="run_bash, least isolated mode (p50, in process)",
                value=stats[sandboxed]["p50_ms"],
                baseline=shell_p50,
                baseline_name=SHELL_ONLY,
                unit="ms",
            ),
        ]
        result.notes.append(
            f"run_bash's least isolated mode ({sandboxed}) takes "
            f"{stats[sandboxed]['p50_ms'] - shell_p50:.2f} ms more than a bare "
            f"{SHELL_ONLY} (p50): {stats[same_line]['p50_ms'] - shell_p50:.2f} ms of it is "
            "starting the wrapper programs of that mode (the same command line run by "
            f"subprocess.run), {stats[sandboxed]['p50_ms'] - stats[same_line]['p50_ms']:.2f} ms "
            "is run_bash's own work (pipes, reading, killing and sweeping leftovers)."
        )
    through_pool = (
        ("above a no-op (p50, worker ready)", above_noop, POOL_COST_GOAL),
        ("above a no-op (p50, back to back)", above_noop_back_to_back, None),
        (f"above a no-op (p50, after a pause of {PAUSE_S * 1000:.0f} ms)", above_noop_paused, None),
        ("(p50, worker ready)", stats[POOL]["p50_ms"], None),
    )
    result.comparisons += [
        Comparison(
            metric=f"run_bash through the sandbox pool {how}",
            value=value,
            baseline=shell_p50,
            baseline_name=SHELL_ONLY,
            unit="ms",
            goal=goal,
        )
        for how, value, goal in through_pool
    ]
    return result


POOL_MODES_NOTE = (
    "Through the pool, run_bash is sent the two ways the no-op of case 1 is, and its cost is "
    "taken above the no-op's p50 sent the same way. \"Worker ready\" (the goal's): each call "
    "goes once every worker waits for work again, as an agent's next command follows a model "
    'turn. "Back to back": each goes the moment the previous answer arrives, while the sandbox '
    "worker still ends that call's namespace and makes the next launch on the same cores. "
    f'"After a pause": run_bash and the no-op in turns, each sent {PAUSE_S * 1000:.0f} ms after '
    "the previous answer: shorter than a model turn, and meant to let the sandbox worker's "
    "work between calls (the namespace's end, the launch made for the run, at the lowest "
    "priority) end before the next call, which worker ready does not wait for."
)
