"""Batches in Redis: a hash of a batch's status and counts, a list of its output records, and a
list of their summaries (what the viewer's table shows, without the transcripts)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from api.batch.summary import ItemSummary
from api.state.listing import Listed, ListQuery, list_current, record_tags
from api.state.records import ACTIVE, HashFields, RecordStore, lost_error, optional_float
from worker.contract.keys import (
    ACTIVE_BATCHES,
    DEFAULT_TENANT,
    batch_results_key,
    batch_state_key,
    batch_summaries_key,
    batches_index_key,
)

BatchStatus = Literal["queued", "running", "succeeded", "failed"]


class BatchProgress(BaseModel):
    total: int
    done: int = 0
    ok: int = 0
    error: int = 0
    running: int = 0


class BatchSummary(BaseModel):
    """A batch as ``GET /v1/batches`` lists it: its progress, without its results."""

    id: str
    status: BatchStatus
    concurrency: int
    replica: str
    created_at: float
    finished_at: float | None = None
    error: str | None = Field(None, description="Why the batch stopped early, if it did.")
    progress: BatchProgress
    tags: list[str] = Field(default_factory=list, description="What the batch was started with.")


class BatchState(BatchSummary):
    """What ``GET /v1/batches/{id}`` answers: progress and one page of output records."""

    offset: int = 0
    limit: int = 0
    results: list[dict[str, Any]] = Field(default_factory=list)


@dataclass(frozen=True)
class ScoredBatch:
    """A batch's state without its results, and how many of its items were scored and passed."""

    state: BatchState
    scored: int
    passed: int


class BatchStore(RecordStore):
    """Reads and writes batches, their progress and their output records."""

    async def create_batch(
        self,
        batch_id: str,
        *,
        total: int,
        concurrency: int,
        replica: str,
        tenant: str = DEFAULT_TENANT,
        tags: Sequence[str] = (),
    ) -> None:
        fields: HashFields = {
            "tenant": tenant,
            "tags": json.dumps(list(tags)),
            "total": total,
            "concurrency": concurrency,
            "replica": replica,
            "done": 0,
            "ok": 0,
            "errors": 0,
            "running": 0,
        }
        await self._create(
            batch_state_key(batch_id), batch_id, fields, ACTIVE_BATCHES, batches_index_key(tenant)
        )

    async def mark_batch_running(self, batch_id: str) -> bool:
        return await self._apply(
            batch_state_key(batch_id),
            batch_results_key(batch_id),
            ("queued",),
            {"status": "running"},
        )

    async def batch_item_started(self, batch_id: str) -> None:
        await self.redis.hincrby(batch_state_key(batch_id), "running", 1)

    async def add_batch_result(self, batch_id: str, record: Mapping[str, Any]) -> None:
        summary = ItemSummary.of(record)
        state = batch_state_key(batch_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(batch_results_key(batch_id), json.dumps(record))
            pipe.rpush(batch_summaries_key(batch_id), summary.to_json())
            pipe.hincrby(state, "done", 1)
            pipe.hincrby(state, "ok" if summary.status == "ok" else "errors", 1)
            pipe.hincrby(state, "running", -1)
            if summary.passed is not None:
                pipe.hincrby(state, "scored", 1)
                pipe.hincrby(state, "passed", int(summary.passed))
            await pipe.execute()

    async def finish_batch(
        self, batch_id: str, status: BatchStatus, *, error: str | None = None
    ) -> bool:
        fields: dict[str, str] = {"status": status, "running": "0"}
        if error is not None:
            fields["error"] = error
        return await self._apply(
            batch_state_key(batch_id),
            batch_results_key(batch_id),
            ACTIVE,
            fields,
            active=(ACTIVE_BATCHES, batch_id),
            now="finished_at",
            expiring=[batch_summaries_key(batch_id)],
        )

    async def get_batch(
        self, batch_id: str, *, offset: int, limit: int, tenant: str | None = None
    ) -> BatchState | None:
        """The batch with a page of its results, or None when there is none, or when it is not
        ``tenant``'s (None: whoever's): another tenant's batch is answered as an unknown one is."""
        fields = await self._batch_fields(batch_id, tenant)
        if fields is None:
            return None
        raw = await self.redis.lrange(batch_results_key(batch_id), offset, offset + limit - 1)
        state = _batch_state(fields)
        return state.model_copy(
            update={"offset": offset, "limit": limit, "results": [json.loads(r) for r in raw]}
        )

    async def scored_batch(self, batch_id: str, *, tenant: str | None = None) -> ScoredBatch | None:
        """As ``get_batch``, without results."""
        fields = await self._batch_fields(batch_id, tenant)
        return None if fields is None else _scored(fields)

    async def list_batches(
        self, query: ListQuery, *, tenant: str = DEFAULT_TENANT
    ) -> Listed[ScoredBatch]:
        """A page of ``tenant``'s batches still kept, newest first, as ``query`` filters them."""
        index = batches_index_key(tenant)
        listed = await list_current(
            self.redis, index, batch_state_key, query, tenant, self._batch_fields
        )
        return listed.map(_scored)

    async def batch_summaries(self, batch_id: str, start: int, stop: int) -> list[ItemSummary]:
        """The summaries of results ``start`` to ``stop`` (inclusive; -1 for the last)."""
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.lrange(batch_summaries_key(batch_id), start, stop)
            pipe.llen(batch_results_key(batch_id))
            raw, results = await pipe.execute()
        summaries = [ItemSummary.from_json(item) for item in raw]
        end = results - 1 if stop < 0 else min(stop, results - 1)
        missing_from = start + len(summaries)
        if missing_from <= end:  # results recorded before summaries were kept
            records = await self.redis.lrange(batch_results_key(batch_id), missing_from, end)
            summaries += [ItemSummary.of(json.loads(record)) for record in records]
        return summaries

    async def batch_result(self, batch_id: str, index: int) -> dict[str, Any] | None:
        """The output record at ``index``, in the order results finished."""
        raw = await self.redis.lindex(batch_results_key(batch_id), index)
        return None if raw is None else cast(dict[str, Any], json.loads(raw))

    async def _batch_fields(
        self, batch_id: str, tenant: str | None = None
    ) -> dict[str, str] | None:
        reap = functools.partial(self._reap_batch, batch_id)
        return await self._current(batch_state_key(batch_id), reap, tenant)

    async def _reap_batch(self, batch_id: str, replica: str) -> bool:
        """Fail an active batch whose replica's lease expired; True if this ended it."""
        if not await self._lease_expired(replica):
            return False
        return await self.finish_batch(batch_id, "failed", error=lost_error(replica, "batch"))


def _batch_state(fields: dict[str, str]) -> BatchState:
    return BatchState(
        id=fields["id"],
        status=cast(BatchStatus, fields["status"]),
        concurrency=int(fields["concurrency"]),
        replica=fields["replica"],
        created_at=float(fields["created_at"]),
        finished_at=optional_float(fields.get("finished_at")),
        error=fields.get("error"),
        progress=BatchProgress(
            total=int(fields["total"]),
            done=int(fields["done"]),
            ok=int(fields["ok"]),
            error=int(fields["errors"]),
            running=max(int(fields["running"]), 0),
        ),
        tags=record_tags(fields),
    )


def _scored(fields: dict[str, str]) -> ScoredBatch:
    return ScoredBatch(
        _batch_state(fields), int(fields.get("scored", 0)), int(fields.get("passed", 0))
    )
