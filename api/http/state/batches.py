"""Batches in Redis: a hash of a batch's status and counts, and a list of its output records."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from api.http.state.keys import ACTIVE, ACTIVE_BATCHES, batch_results_key, batch_state_key
from api.http.state.records import HashFields, RecordStore, lost_error, optional_float

BatchStatus = Literal["queued", "running", "succeeded", "failed"]


class BatchProgress(BaseModel):
    total: int
    done: int = 0
    ok: int = 0
    error: int = 0
    running: int = 0


class BatchState(BaseModel):
    """What ``GET /v1/batches/{id}`` answers: progress and one page of output records."""

    id: str
    status: BatchStatus
    concurrency: int
    replica: str
    created_at: float
    finished_at: float | None = None
    error: str | None = Field(None, description="Why the batch stopped early, if it did.")
    progress: BatchProgress
    offset: int = 0
    limit: int = 0
    results: list[dict[str, Any]] = Field(default_factory=list)


class BatchStore(RecordStore):
    """Reads and writes batches, their progress and their output records."""

    async def create_batch(
        self, batch_id: str, *, total: int, concurrency: int, replica: str
    ) -> None:
        fields: HashFields = {
            "total": total,
            "concurrency": concurrency,
            "replica": replica,
            "done": 0,
            "ok": 0,
            "errors": 0,
            "running": 0,
        }
        await self._create(batch_state_key(batch_id), batch_id, fields, ACTIVE_BATCHES)

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
        ok = record.get("status") == "ok"
        state = batch_state_key(batch_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(batch_results_key(batch_id), json.dumps(record))
            pipe.hincrby(state, "done", 1)
            pipe.hincrby(state, "ok" if ok else "errors", 1)
            pipe.hincrby(state, "running", -1)
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
        )

    async def get_batch(self, batch_id: str, *, offset: int, limit: int) -> BatchState | None:
        fields = await self._hash(batch_state_key(batch_id))
        if not fields:
            return None
        if fields["status"] in ACTIVE and await self._reap_batch(batch_id, fields["replica"]):
            fields = await self._hash(batch_state_key(batch_id))
        raw = await self.redis.lrange(batch_results_key(batch_id), offset, offset + limit - 1)
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
            offset=offset,
            limit=limit,
            results=[json.loads(item) for item in raw],
        )

    async def _reap_batch(self, batch_id: str, replica: str) -> bool:
        """Fail an active batch whose replica's lease expired; True if this ended it."""
        if not await self._lease_expired(replica):
            return False
        return await self.finish_batch(batch_id, "failed", error=lost_error(replica, "batch"))
