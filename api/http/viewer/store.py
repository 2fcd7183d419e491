"""``toolq serve``'s data for the viewer: runs and batches from the API's Redis state, and the
fleet as its workers, its broker and this replica's recent calls describe it."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

from redis.exceptions import RedisError

from api.batch.summary import ItemSummary
from api.calls.fleet import Fleet
from api.http.services import Services, read_queue_depths
from api.http.sse import run_event_stream
from api.http.viewer.sources import BatchView, FleetView, PoolView, RunEvents, WorkerView
from api.state.batches import ScoredBatch
from api.state.listing import Listed, ListQuery
from api.state.records import ACTIVE, EVENTS_MAXLEN
from api.state.runs import RunState, RunSummary
from worker.contract.wire import POOLS

#: Batches whose summaries are kept in memory, for filtering and sorting all of their items.
CACHED_BATCHES = 4
#: Width of one bar of the fleet's rate chart.
RATE_BUCKET_S = 10.0


class StoreSources:
    """One tenant's batches and runs, and the fleet, of one API replica; one per tenant.

    Only ``batch`` and ``run`` look at whose a batch or a run is: the pages ask them first, and
    read a batch's results or a run's events only once they have found it.
    """

    def __init__(self, services: Services, tenant: str) -> None:
        self._services = services
        self._store = services.store
        self._tenant = tenant
        self._summaries: OrderedDict[str, list[ItemSummary]] = OrderedDict()

    # -- batches --------------------------------------------------------------------------------

    async def batches(self, query: ListQuery) -> Listed[BatchView]:
        listed = await self._store.list_batches(query, tenant=self._tenant)
        return listed.map(_batch_view)

    async def batch(self, batch_id: str) -> BatchView | None:
        batch = await self._store.scored_batch(batch_id, tenant=self._tenant)
        return None if batch is None else _batch_view(batch)

    async def summaries(self, batch_id: str, start: int, count: int) -> list[ItemSummary]:
        return await self._store.batch_summaries(batch_id, start, start + count - 1)

    async def all_summaries(self, batch_id: str) -> list[ItemSummary]:
        """Every summary: those cached, and those recorded since (results only ever append)."""
        cached = self._summaries.pop(batch_id, [])
        cached += await self._store.batch_summaries(batch_id, len(cached), -1)
        self._summaries[batch_id] = cached
        while len(self._summaries) > CACHED_BATCHES:
            self._summaries.popitem(last=False)
        return list(cached)

    async def record(self, batch_id: str, index: int) -> dict[str, Any] | None:
        return await self._store.batch_result(batch_id, index)

    # -- runs -----------------------------------------------------------------------------------

    async def runs(self, query: ListQuery) -> Listed[RunSummary]:
        return await self._store.list_runs(query, tenant=self._tenant)

    async def run(self, run_id: str) -> RunState | None:
        return await self._store.get_run(run_id, tenant=self._tenant)

    async def events(self, run_id: str) -> RunEvents:
        entries = await self._store.read_events(run_id, "0", block_ms=0, count=EVENTS_MAXLEN)
        last_id = entries[-1][0] if entries else "0"
        return RunEvents([event for _, event in entries], last_id)

    def stream(self, run_id: str, after: str, *, ended: bool) -> AsyncIterator[bytes]:
        return run_event_stream(self._store, self._services.event_hub, run_id, after, ended=ended)

    # -- the fleet ------------------------------------------------------------------------------

    async def fleet(self) -> FleetView:
        services = self._services
        problems = []
        try:
            fleet = await services.executor.fleet()
        except (RedisError, OSError) as exc:
            fleet = Fleet(tools={})
            problems.append(f"the fleet's workers could not be read: {exc}")
        depths = await read_queue_depths(services)
        if depths is None:
            problems.append("the broker did not say how deep its queues are")
        recent = services.metrics.recent
        pools = [
            PoolView(
                name=pool,
                workers=[
                    WorkerView(w.worker, w.host, w.pid, w.started, w.beat_at)
                    for w in sorted(fleet.workers.get(pool, []), key=lambda w: w.worker)
                ],
                tools=[spec.name for spec in fleet.model_tools.values() if spec.pool == pool],
                queue_depth=None if depths is None else depths.get(pool),
                operations=[
                    spec.name
                    for spec in fleet.tools.values()
                    if spec.pool == pool and not spec.for_model
                ],
            )
            for pool in POOLS
        ]
        window = recent.samples()  # one copy of the window for both figures
        return FleetView(
            pools=pools,
            rates=recent.rates(RATE_BUCKET_S, window),
            latency=recent.latency_by_tool(window),
            window_s=recent.window_s,
            replica=services.replica,
            problems=problems,
        )


def _batch_view(batch: ScoredBatch) -> BatchView:
    state = batch.state
    progress = state.progress
    return BatchView(
        id=state.id,
        title=state.id,
        status=state.status,
        live=state.status in ACTIVE,
        total=progress.total,
        done=progress.done,
        ok=progress.ok,
        error=progress.error,
        running=progress.running,
        scored=batch.scored,
        passed=batch.passed,
        created_at=state.created_at,
        finished_at=state.finished_at,
        problem=state.error,
        tags=tuple(state.tags),
    )
