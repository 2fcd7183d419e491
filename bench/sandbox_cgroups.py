"""Case 9: run_bash 'true' through the sandbox pool with a control group per call and without,
and with the workspace quota's accounting on, in the same run.

Each configuration is a sandbox worker of its own (one process), started in turn; the rounds
alternate the configurations, so a change in the machine's load falls on all of them alike.
The run's workspace holds a few hundred files, so the quota's measurement has something to walk.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from bench.round_trip import RUN_ID
from bench.sandbox_cost import pool_timings
from bench.stack import toolq_workers
from bench.stats import CaseResult, Comparison, summarize
from worker.contract.settings import WorkerSettings

WITHOUT = "run_bash 'true', no control group (TOOLQ_SANDBOX_CGROUP=off), no quota"
GROUPED = "run_bash 'true', a control group per call, no quota"
QUOTA = "run_bash 'true', a control group per call and the quota's accounting (1 GiB)"
CONFIGURATIONS: dict[str, dict[str, Any]] = {
    WITHOUT: {"sandbox_cgroup": "off", "workspace_quota_bytes": 0},
    GROUPED: {"sandbox_cgroup": "auto", "workspace_quota_bytes": 0},
    QUOTA: {"sandbox_cgroup": "auto", "workspace_quota_bytes": 1 << 30},
}
#: The control group may add this much to run_bash's p50 through the pool.
GOAL_RATIO = 1.25
WORKSPACE_FILES = 300


def cgroup_case(settings: WorkerSettings, calls: int, warmup: int, rounds: int) -> CaseResult:
    _fill_workspace(Path(settings.workspace_root) / RUN_ID)
    samples: dict[str, list[float]] = {name: [] for name in CONFIGURATIONS}
    layers: dict[str, list[str]] = {}
    per_round = max(1, calls // rounds)
    for _ in range(rounds):
        for name, update in CONFIGURATIONS.items():
            configured = settings.model_copy(update=update)
            with toolq_workers(configured, 1, ("sandbox",)):
                taken, layers[name] = asyncio.run(pool_timings(configured, per_round, warmup))
            samples[name] += taken
    stats = {name: summarize(values) for name, values in samples.items()}
    base = stats[WITHOUT]["p50_ms"]
    result = CaseResult(
        key="run_bash_cgroups",
        title="9. run_bash through the sandbox pool: a control group per call, and the quota",
        figures={
            "latency": stats,
            "isolation layers": layers,
            "rounds": rounds,
            "workspace files": WORKSPACE_FILES,
            "p50 added ms": {
                name: round(s["p50_ms"] - base, 3) for name, s in stats.items() if name != WITHOUT
            },
        },
        samples_ms=samples,
    )
    for name, metric in (
        (GROUPED, "run_bash p50 through the pool, a control group per call"),
        (QUOTA, "run_bash p50 through the pool, a control group per call and the quota"),
    ):
        result.comparisons.append(
            Comparison(
                metric=metric,
                value=stats[name]["p50_ms"],
                baseline=base,
                baseline_name="no control group, no quota",
                unit="ms",
                goal=GOAL_RATIO,
            )
        )
    grouped, quota = stats[GROUPED]["p50_ms"], stats[QUOTA]["p50_ms"]
    result.notes.append(
        f"A control group per run_bash call adds {grouped - base:.2f} ms to the p50 through the "
        f"pool ({base:.2f} → {grouped:.2f} ms); measuring a workspace of {WORKSPACE_FILES} files "
        f"after each call adds {quota - grouped:.2f} ms more."
    )
    return result


def _fill_workspace(root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    for index in range(WORKSPACE_FILES):
        folder = root / f"dir{index % 10}"
        folder.mkdir(exist_ok=True)
        (folder / f"file{index}.txt").write_text("x" * 1024)
