"""Where the viewer's pages get their data: batches, runs and the fleet, each behind a protocol.

``toolq serve`` reads all three from its Redis state and its fleet (``api.http.viewer.store``);
``toolq view`` reads one batch from a results file and has no runs and no fleet
(``api.http.viewer.results_file``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from api.batch.summary import ItemSummary
from api.http.recent_calls import RateBucket, ToolLatency
from api.state.listing import Listed, ListQuery

if TYPE_CHECKING:  # toolq view has no runs
    from api.state.runs import RunState, RunSummary


@dataclass(frozen=True)
class BatchView:
    """A batch as the viewer shows it: where it is and how it went."""

    id: str
    title: str
    status: str
    #: Its numbers may still change: it runs, or its file is still being read.
    live: bool
    #: Items in all; None when not known (a results file holds only the finished ones).
    total: int | None
    done: int
    ok: int
    error: int
    running: int = 0
    scored: int = 0
    passed: int = 0
    created_at: float | None = None
    finished_at: float | None = None
    problem: str | None = None
    note: str | None = None
    tags: tuple[str, ...] = ()

    @property
    def pass_rate(self) -> float | None:
        return self.passed / self.scored if self.scored else None

    @property
    def progress_max(self) -> int:
        return max(self.total or self.done, 1)


class BatchSource(Protocol):
    """Batches and their results, in the order the results finished."""

    async def batches(self, query: ListQuery) -> Listed[BatchView]:
        """A page of the batches, newest first, as ``query`` filters them."""
        ...

    async def batch(self, batch_id: str) -> BatchView | None: ...

    async def summaries(self, batch_id: str, start: int, count: int) -> list[ItemSummary]:
        """``count`` summaries from the ``start``-th result (0 = the first to finish)."""
        ...

    async def all_summaries(self, batch_id: str) -> list[ItemSummary]: ...

    async def record(self, batch_id: str, index: int) -> dict[str, Any] | None:
        """The whole output record at ``index`` (0 = the first to finish)."""
        ...


@dataclass(frozen=True)
class RunEvents:
    """A run's events so far, and the stream id of the last, to follow on from."""

    events: list[dict[str, Any]]
    last_id: str


class RunSource(Protocol):
    """Runs of the API: their state, their events, and a live stream of them."""

    async def runs(self, query: ListQuery) -> Listed[RunSummary]:
        """A page of the runs, newest first, as ``query`` filters them."""
        ...

    async def run(self, run_id: str) -> RunState | None: ...

    async def events(self, run_id: str) -> RunEvents: ...

    def stream(self, run_id: str, after: str, *, ended: bool) -> AsyncIterator[bytes]: ...


@dataclass(frozen=True)
class WorkerView:
    name: str
    host: str
    pid: int
    started: float
    beat_at: float | None


@dataclass(frozen=True)
class PoolView:
    name: str
    workers: list[WorkerView]
    #: The tools models call.
    tools: list[str]
    #: Calls waiting in the pool's queue; None when the broker did not say.
    queue_depth: int | None
    #: The service operations (``toolq.*``) callers use to move files and run commands; models
    #: never see them.
    operations: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FleetView:
    pools: list[PoolView]
    rates: list[RateBucket]
    latency: list[ToolLatency]
    window_s: float
    replica: str
    problems: list[str] = field(default_factory=list)


class FleetSource(Protocol):
    async def fleet(self) -> FleetView: ...
