"""Prometheus metrics of an orchestrator process: tool calls, their latency, what their commands
used, queues and runs.

What a command used (run_bash's ``usage``) is measured by its worker and travels in the call's
result, so it is counted here, as the answers arrive, rather than on the workers: sandbox workers
take no connections (no port for Prometheus to scrape), and every call a fleet serves for this
orchestrator passes through it once.

Every ``ApiMetrics`` has its own ``CollectorRegistry``, so two apps in one process (tests, an API
and a batch) never share or double-register series.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from api.conversation.events import AgentEvent, ToolCallFinished, ToolCallStarted
from api.http.recent_calls import RecentCalls

CONTENT_TYPE = CONTENT_TYPE_LATEST
#: The ``tool`` label of calls to tools the fleet does not serve. Models invent tool names; one
#: series each would let a model grow the metrics without bound.
UNKNOWN_TOOL = "unknown"
#: The error kinds of calls answered without running any tool: the tool is unknown to the fleet,
#: or switched off. Their near-zero durations are no tool's latency.
REFUSED_KINDS = frozenset({"unknown_tool", "tool_disabled"})
#: From a no-op on a warm worker (milliseconds) to a long shell command (minutes).
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)
#: From a shell builtin (a millisecond) to a command busy on every core until its time limit.
CPU_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 5, 10, 30, 60, 120, 300, 600, 1200)
#: From a shell's few hundred KiB to the memory limit of large jobs (8 GiB).
MEMORY_BUCKETS = tuple(float(1 << shift) for shift in range(20, 34))
#: From one process to a fork bomb held at the limit.
PROCESS_BUCKETS = (0, 1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


class ApiMetrics:
    """The series one process exposes on ``/metrics``.

    A call's ``tool`` label is its tool's name only for the tools of ``know_tools``: those the
    fleet has served since the process started. Every other call counts under ``unknown``.
    """

    def __init__(self, tools: Iterable[str] = ()) -> None:
        self._tools: set[str] = set(tools)
        self.registry = CollectorRegistry()
        self.tool_calls = Counter(
            "toolq_tool_calls",
            "Tool calls answered, by tool and outcome (ok, or the error kind).",
            ["tool", "outcome"],
            registry=self.registry,
        )
        self.tool_call_seconds = Histogram(
            "toolq_tool_call_seconds",
            "Time a tool call ran, as its executor measured it.",
            ["tool"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        # What one command used, by pool (the orchestrator's own calls under "orchestrator").
        by_pool = functools.partial(Histogram, labelnames=["pool"], registry=self.registry)
        self.command_cpu_seconds = by_pool(
            "toolq_command_cpu_seconds",
            "CPU time (user and system) of a command and every process it started.",
            buckets=CPU_BUCKETS,
        )
        self.command_memory_peak_bytes = by_pool(
            "toolq_command_memory_peak_bytes",
            "The most memory a command's processes held at once.",
            buckets=MEMORY_BUCKETS,
        )
        self.command_processes_peak = by_pool(
            "toolq_command_processes_peak",
            "The most processes a command had at once.",
            buckets=PROCESS_BUCKETS,
        )
        self.command_killed_processes = by_pool(
            "toolq_command_killed_processes",
            "Processes a command left running (or had at its timeout), killed by the sandbox.",
            buckets=PROCESS_BUCKETS,
        )
        self.command_oom_kills = Counter(
            "toolq_command_oom_kills",
            "Commands the memory limit stopped.",
            ["pool"],
            registry=self.registry,
        )
        self.tool_calls_in_flight = Gauge(
            "toolq_tool_calls_in_flight",
            "Tool calls sent by this process and not answered yet.",
            registry=self.registry,
        )
        self.queue_depth = Gauge(
            "toolq_queue_depth",
            "Calls waiting in each pool's queue, read from the broker at scrape time.",
            ["pool"],
            registry=self.registry,
        )
        self.runs = Counter(
            "toolq_runs",
            "Runs that ended, by final status.",
            ["status"],
            registry=self.registry,
        )
        self.batch_items = Counter(
            "toolq_batch_items",
            "Batch items that ended, by outcome (ok or error).",
            ["outcome"],
            registry=self.registry,
        )
        #: The calls of the last minutes, for the viewer's fleet page.
        self.recent = RecentCalls()

    def know_tools(self, names: Iterable[str]) -> None:
        """Tools the fleet serves (as read from its manifest): their calls count under their
        own name from now on."""
        self._tools.update(names)

    def record_event(self, event: AgentEvent) -> None:
        """An ``Agent.observers`` entry: counts calls, their outcome and latency."""
        if isinstance(event, ToolCallStarted):
            self.tool_calls_in_flight.inc()
        elif isinstance(event, ToolCallFinished):
            self.tool_calls_in_flight.dec()
            self._count_call(event.name, event.is_error, event.error_kind, event.duration_ms)
            self.record_usage(event.pool, event.usage)

    def record_usage(self, pool: str | None, usage: Mapping[str, Any] | None) -> None:
        """What one command used, in its pool's histograms; figures it could not measure (null)
        are left out rather than counted as zero."""
        if not usage:
            return
        label = pool or "orchestrator"
        observed = (
            (self.command_cpu_seconds, "cpu_ms", 1 / 1000),
            (self.command_memory_peak_bytes, "max_rss_kb", 1024),
            (self.command_processes_peak, "pids_peak", 1),
            (self.command_killed_processes, "killed_processes", 1),
        )
        for histogram, field, scale in observed:
            value = usage.get(field)
            if isinstance(value, int | float):
                histogram.labels(pool=label).observe(value * scale)
        if usage.get("oom_killed"):
            self.command_oom_kills.labels(pool=label).inc()

    def record_tool_calls(self, calls: Iterable[Mapping[str, Any]]) -> None:
        """Count calls after the fact, from a transcript's ``tool_calls`` (batch items)."""
        for call in calls:
            self._count_call(
                str(call["name"]),
                bool(call.get("is_error")),
                call.get("error_kind"),
                float(call.get("duration_ms") or 0),
            )
            self.record_usage(call.get("pool"), call.get("usage"))

    def _count_call(
        self, name: str, is_error: bool, error_kind: str | None, duration_ms: float
    ) -> None:
        tool = name if name in self._tools else UNKNOWN_TOOL
        # Error kinds are a fixed set (worker/contract/wire.py ErrorKind): the label stays bounded.
        outcome = (error_kind or "error") if is_error else "ok"
        self.tool_calls.labels(tool=tool, outcome=outcome).inc()
        refused = is_error and error_kind in REFUSED_KINDS
        if not refused:
            self.tool_call_seconds.labels(tool=tool).observe(duration_ms / 1000)
        self.recent.add(tool, outcome == "ok", duration_ms / 1000, refused=refused)

    def record_run(self, status: str) -> None:
        self.runs.labels(status=status).inc()

    def record_batch_item(self, ok: bool) -> None:
        self.batch_items.labels(outcome="ok" if ok else "error").inc()

    def set_queue_depths(self, depths: Mapping[str, int] | None) -> None:
        """The broker's answer at scrape time; ``None`` (unreachable) shows no stale numbers."""
        self.queue_depth.clear()
        for pool, depth in (depths or {}).items():
            self.queue_depth.labels(pool=pool).set(depth)

    def render(self) -> bytes:
        """The exposition text for a scrape."""
        return bytes(generate_latest(self.registry))


class RunObserver:
    """Feeds one conversation's events to the metrics; ``close()`` settles calls cut short.

    A cancelled conversation never sees the answers of its calls in flight, so without this the
    in-flight gauge would keep counting them forever.
    """

    def __init__(self, metrics: ApiMetrics) -> None:
        self._metrics = metrics
        self._open = 0

    def __call__(self, event: AgentEvent) -> None:
        if isinstance(event, ToolCallStarted):
            self._open += 1
        elif isinstance(event, ToolCallFinished):
            self._open -= 1
        self._metrics.record_event(event)

    def close(self) -> None:
        if self._open > 0:
            self._metrics.tool_calls_in_flight.dec(self._open)
        self._open = 0
