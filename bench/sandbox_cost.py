"""Case 4: run_bash ``true`` through the sandbox pool next to ``subprocess.run``, and the cost of
each isolation layer of ``worker.sandbox`` measured in process.

The layers a worker adds depend on who it runs as: an unprivileged worker gets a session of its
own and a clean environment; as root it also drops to the sandbox user under resource limits;
namespaces come on top. The unprivileged case is measured in a forked child that gives up root,
since the sandbox decides by the effective uid.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import pwd
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

import redis

from api.dispatch import Dispatcher
from bench.round_trip import RUN_ID
from bench.stats import CaseResult, Comparison, summarize
from worker.manifest import read_manifest
from worker.sandbox import Isolation, SandboxConfig, SandboxError, run_sandboxed
from worker.settings import Settings

COMMAND = "true"
OVERHEAD_GOAL_MS = 2.0
SUBPROCESS = "subprocess.run(['/bin/sh', '-c', 'true'])"
POOL = "run_bash 'true' through the sandbox pool"
PLAIN = "plain spawn: own session, clean environment (unprivileged worker)"


@dataclass(frozen=True)
class Layer:
    label: str
    isolation: Isolation
    unprivileged: bool


LAYERS = (
    Layer(PLAIN, "process", unprivileged=True),
    Layer("+ user namespace, PID/net namespaces (unprivileged worker)", "namespaces", True),
    Layer("+ sandbox user, rlimits, no-new-privs (root worker)", "process", False),
    Layer("+ PID/net namespaces (root worker)", "namespaces", False),
)


def _timings(action: Callable[[], object], calls: int, warmup: int) -> list[float]:
    samples = []
    for index in range(warmup + calls):
        started = time.perf_counter()
        action()
        elapsed = (time.perf_counter() - started) * 1000
        if index >= warmup:
            samples.append(elapsed)
    return samples


def subprocess_timings(calls: int, warmup: int) -> list[float]:
    return _timings(lambda: subprocess.run(["/bin/sh", "-c", COMMAND], check=True), calls, warmup)


def layer_timings(folder: Path, isolation: Isolation, calls: int, warmup: int) -> list[float]:
    """Milliseconds per ``run_sandboxed('true')``; raises ``SandboxError`` if not available."""
    config = SandboxConfig(isolation=isolation)

    def run() -> None:
        result = run_sandboxed(
            COMMAND, cwd=folder, home=folder, env={}, timeout_ms=10_000, config=config
        )
        if result.exit_code != 0:
            raise SandboxError(f"'true' failed: {result.stderr}")

    return _timings(run, calls, warmup)


def _unprivileged_child(
    conn: Connection, folder: Path, isolation: Isolation, calls: int, warmup: int
) -> None:
    nobody = pwd.getpwnam("nobody")
    os.setgroups([])
    os.setgid(nobody.pw_gid)
    os.setuid(nobody.pw_uid)
    try:
        conn.send(layer_timings(folder, isolation, calls, warmup))
    except SandboxError as exc:
        conn.send(str(exc))
    finally:
        conn.close()


def unprivileged_layer_timings(
    folder: Path, isolation: Isolation, calls: int, warmup: int
) -> list[float]:
    """As ``layer_timings``, in a forked child that has given up root first."""
    if os.geteuid() != 0:
        return layer_timings(folder, isolation, calls, warmup)
    context = multiprocessing.get_context("fork")
    receive, send = context.Pipe(duplex=False)
    child = context.Process(
        target=_unprivileged_child, args=(send, folder, isolation, calls, warmup)
    )
    child.start()
    send.close()
    answer = receive.recv()
    child.join(30)
    if isinstance(answer, str):
        raise SandboxError(answer)
    return list(answer)


def sandbox_layers(calls: int, warmup: int) -> dict[str, list[float] | str]:
    """Samples per layer, or why the layer is not available here. Run before any thread starts:
    the unprivileged layers are measured in forked children."""
    found: dict[str, list[float] | str] = {SUBPROCESS: subprocess_timings(calls, warmup)}
    with tempfile.TemporaryDirectory(prefix="toolq-bench-sandbox-") as name:
        folder = Path(name)
        folder.chmod(0o777)
        for layer in LAYERS:
            try:
                if layer.unprivileged:
                    found[layer.label] = unprivileged_layer_timings(
                        folder, layer.isolation, calls, warmup
                    )
                elif os.geteuid() == 0:
                    found[layer.label] = layer_timings(folder, layer.isolation, calls, warmup)
                else:
                    found[layer.label] = "needs a root worker"
            except SandboxError as exc:
                found[layer.label] = f"not available here: {exc}"
    return found


async def pool_timings(
    settings: Settings, calls: int, warmup: int
) -> tuple[list[float], list[str]]:
    """run_bash 'true' round trips through the sandbox pool, and the layers the pool used."""
    client = redis.Redis.from_url(settings.redis_url)
    spec = read_manifest(client)["run_bash"]
    client.close()
    samples: list[float] = []
    layers: list[str] = []
    async with Dispatcher(settings) as dispatcher:
        for index in range(warmup + calls):
            started = time.perf_counter()
            request = dispatcher.build_request(
                spec, tool_call_id=uuid.uuid4().hex, run_id=RUN_ID, arguments={"command": COMMAND}
            )
            result = await dispatcher.call(request, spec.pool)
            elapsed = (time.perf_counter() - started) * 1000
            if result.is_error or json.loads(result.output)["exit_code"] != 0:
                raise RuntimeError(f"run_bash 'true' failed: {result.output}")
            layers = json.loads(result.output)["isolation"]
            if index >= warmup:
                samples.append(elapsed)
    return samples, layers


def sandbox_case(
    settings: Settings,
    layers: dict[str, list[float] | str],
    noop_p50_ms: float,
    calls: int,
    warmup: int,
) -> CaseResult:
    pool, pool_layers = asyncio.run(pool_timings(settings, calls, warmup))
    baseline = layers[SUBPROCESS]
    assert isinstance(baseline, list)
    samples = {POOL: pool, **{k: v for k, v in layers.items() if isinstance(v, list)}}
    stats = {name: summarize(values) for name, values in samples.items()}
    unavailable = {k: v for k, v in layers.items() if isinstance(v, str)}
    base_p50 = stats[SUBPROCESS]["p50_ms"]
    result = CaseResult(
        key="run_bash",
        title="4. run_bash 'true': the sandbox pool and each isolation layer",
        figures={
            "latency": stats,
            "layers_unavailable": unavailable,
            "pool_isolation_layers": pool_layers,
            "noop_round_trip_p50_ms": noop_p50_ms,
            "pool_p50_minus_noop_round_trip_ms": round(stats[POOL]["p50_ms"] - noop_p50_ms, 3),
            "layer_cost_over_subprocess_p50_ms": {
                name: round(s["p50_ms"] - base_p50, 3)
                for name, s in stats.items()
                if name not in (SUBPROCESS, POOL)
            },
        },
        samples_ms=samples,
    )
    if PLAIN in stats:
        result.comparisons.append(
            Comparison(
                metric="run_bash before isolation, in process (p50)",
                value=stats[PLAIN]["p50_ms"],
                baseline=base_p50,
                baseline_name=SUBPROCESS,
                unit="ms",
                goal=OVERHEAD_GOAL_MS,
                goal_on="difference",
            )
        )
    result.comparisons.append(
        Comparison(
            metric="run_bash through the sandbox pool (p50)",
            value=stats[POOL]["p50_ms"],
            baseline=base_p50,
            baseline_name=SUBPROCESS,
            unit="ms",
        )
    )
    return result
