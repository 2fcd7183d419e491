"""The results as JSON, as a Markdown page, and as a plot of the latency distributions."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import textwrap
from datetime import UTC, datetime
from importlib.metadata import version
from pathlib import Path
from typing import Any

from api.local.stack import redis_server_binary
from bench.stats import CaseResult, Comparison


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine() -> dict[str, Any]:
    server = subprocess.run(
        [redis_server_binary(), "--version"], capture_output=True, text=True, check=False
    ).stdout.split()
    redis_version = next((w[2:] for w in server if w.startswith("v=")), "unknown")
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": len(os.sched_getaffinity(0)),
        "kernel": platform.release(),
        "python": platform.python_version(),
        "celery": version("celery"),
        "kombu": version("kombu"),
        "redis_server": redis_version,
        "redis_py": version("redis"),
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "load_average_at_start": round(os.getloadavg()[0], 2),
    }


def write_json(path: Path, meta: dict[str, Any], cases: list[CaseResult]) -> None:
    data = {
        **meta,
        "goals": [
            {"case": case.key, **c.as_dict()}
            for case in cases
            for c in case.comparisons
            if c.goal is not None
        ],
        "cases": {case.key: case.as_dict() for case in cases},
    }
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def _number(value: float | None) -> str:
    if value is None:
        return "—"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}" if abs(value) < 0.01 else f"{value:.2f}"


def _verdict(comparison: Comparison) -> str:
    passed = comparison.passed
    return "" if passed is None else ("**pass**" if passed else "**FAIL**")


def _comparison_rows(comparisons: list[Comparison], *, with_case: str = "") -> list[str]:
    rows = []
    for c in comparisons:
        lead = f"| {with_case} " if with_case else ""
        rows.append(
            f"{lead}| {c.metric} | {_number(c.value)} {c.unit} | {_number(c.baseline)} "
            f"({c.baseline_name}) | {_number(c.ratio)} | {c.goal_text()} | {_verdict(c)} |"
        )
    return rows


def _latency_table(latency: dict[str, dict[str, float]]) -> list[str]:
    rows = [
        "| | n | p50 ms | p95 ms | p99 ms | mean ms | max ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for name, s in latency.items():
        rows.append(
            f"| {name} | {s['n']} | {_number(s['p50_ms'])} | {_number(s['p95_ms'])} | "
            f"{_number(s['p99_ms'])} | {_number(s['mean_ms'])} | {_number(s['max_ms'])} |"
        )
    return rows


def _figure_lines(figures: dict[str, Any], depth: int = 0) -> list[str]:
    lines = []
    indent = "  " * depth
    for key, value in figures.items():
        label = str(key)
        if label.isidentifier():  # a field name, not a label of its own
            label = label.replace("_", " ")
        if isinstance(value, dict):
            lines.append(f"{indent}- {label}:")
            lines += _figure_lines(value, depth + 1)
        elif isinstance(value, list):
            shown = ", ".join(str(v) for v in value) or "none"
            lines.append(f"{indent}- {label}: {shown}")
        else:
            lines.append(f"{indent}- {label}: {value}")
    return lines


def markdown(meta: dict[str, Any], cases: list[CaseResult], notes: list[str]) -> str:
    m = meta["machine"]
    lines = [
        "# toolq benchmarks",
        "",
        f"- Machine: {m['cpu']}, {m['cores']} cores ({m['usable_cores']} usable), "
        f"Linux {m['kernel']}",
        f"- Python {m['python']}, Celery {m['celery']} (kombu {m['kombu']}), "
        f"Redis server {m['redis_server']} (redis-py {m['redis_py']})",
        f"- Date: {m['date']}; the run took {meta['duration_s']:.0f} s"
        f"{' (quick sizes)' if meta['quick'] else ''}; load average "
        f"{m['load_average_at_start']} at the start, {meta['load_average_at_end']} at the end",
        "",
        "## Goals",
        "",
        "| Case | Metric | toolq | Baseline | Ratio | Goal | Result |",
        "|---|---|---:|---:|---:|---|---|",
    ]
    for case in cases:
        goals = [c for c in case.comparisons if c.goal is not None]
        lines += _comparison_rows(goals, with_case=case.key)
    for case in cases:
        lines += ["", f"## {case.title}", ""]
        lines += [
            "| Metric | toolq | Baseline | Ratio | Goal | Result |",
            "|---|---:|---:|---:|---|---|",
            *_comparison_rows(case.comparisons),
            "",
        ]
        if case.table:
            lines += [*case.table, ""]
        if case.image:
            lines += [f"![{case.title}]({case.image})", ""]
        figures = dict(case.figures)
        latency = figures.pop("latency", None)
        if latency:
            lines += [*_latency_table(latency), ""]
        lines += _figure_lines(figures)
    lines += ["", "## Notes", ""]
    lines += [f"- {note}" for note in notes] or ["- none"]
    lines += ["", "![latency distributions](latency.png)", ""]
    return "\n".join(lines)


def plot(path: Path, cases: list[CaseResult]) -> None:
    """One panel per case with samples, one above the other: each series as a CDF."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with_samples = [case for case in cases if case.samples_ms] or cases[:1]
    figure, axes = plt.subplots(
        len(with_samples),
        1,
        figsize=(11, 4.5 * len(with_samples)),
        squeeze=False,
        layout="constrained",
    )
    for axis, case in zip(axes[:, 0], with_samples, strict=True):
        for name, samples in case.samples_ms.items():
            ordered = sorted(samples)
            fraction = [(i + 1) / len(ordered) for i in range(len(ordered))]
            axis.step(ordered, fraction, where="post", label=textwrap.fill(name, 60))
        axis.set_xscale("log")
        axis.set_xlabel("latency (ms, log scale)")
        axis.set_ylabel("fraction of calls")
        axis.set_title(case.title, fontsize=10)
        axis.grid(True, which="both", alpha=0.3)
        # Outside the axes: the labels are long and the curves fill the panel.
        axis.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    figure.savefig(path, dpi=100, bbox_inches="tight")
    plt.close(figure)
