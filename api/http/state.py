"""Run and batch state in Redis, shared by every API replica.

A run is a hash (``toolq:api:run:<id>``) and a stream of its events (``...:events``); a batch is
a hash and a list of its output records. Status changes go through one Lua script that applies
them only from the statuses allowed, so a run finishes once, whoever (its replica, a cancel, or
the reaper of a dead replica) gets there first. Each replica holds a lease
(``toolq:api:replica:<id>``); runs and batches of a replica whose lease expired are marked failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Literal, cast

import redis.asyncio as aioredis
from pydantic import BaseModel, Field
from redis.exceptions import RedisError

log = logging.getLogger(__name__)

PREFIX = "toolq:api"
CANCEL_CHANNEL = f"{PREFIX}:cancel"
ACTIVE_RUNS = f"{PREFIX}:active:runs"
ACTIVE_BATCHES = f"{PREFIX}:active:batches"
#: Events kept per run; a late reader of a longer run misses the oldest text deltas only.
EVENTS_MAXLEN = 10_000
DONE = "done"

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]
BatchStatus = Literal["queued", "running", "succeeded", "failed"]
ACTIVE: tuple[str, ...] = ("queued", "running")


def run_key(run_id: str) -> str:
    return f"{PREFIX}:run:{run_id}"


def events_key(run_id: str) -> str:
    return f"{PREFIX}:run:{run_id}:events"


def cancel_key(run_id: str) -> str:
    return f"{PREFIX}:run:{run_id}:cancel"


def batch_key(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}"


def results_key(batch_id: str) -> str:
    return f"{PREFIX}:batch:{batch_id}:results"


def lease_key(replica: str) -> str:
    return f"{PREFIX}:replica:{replica}"


# KEYS: state hash, companion key (events stream or results list), active set.
# ARGV: ",allowed,statuses,", member to drop from the active set or "", TTL seconds or "0",
#       event JSON to append to the stream or "", stream MAXLEN, then field/value pairs.
_TRANSITION = """
local status = redis.call('HGET', KEYS[1], 'status')
if not status or not string.find(ARGV[1], ',' .. status .. ',', 1, true) then
  return 0
end
for i = 6, #ARGV, 2 do
  redis.call('HSET', KEYS[1], ARGV[i], ARGV[i + 1])
end
if ARGV[4] ~= '' then
  redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[5], '*', 'event', ARGV[4])
end
if ARGV[2] ~= '' then
  redis.call('SREM', KEYS[3], ARGV[2])
end
if ARGV[3] ~= '0' then
  redis.call('EXPIRE', KEYS[1], ARGV[3])
  redis.call('EXPIRE', KEYS[2], ARGV[3])
end
return 1
"""


class RunState(BaseModel):
    """What ``GET /v1/runs/{id}`` answers."""

    id: str
    status: RunStatus
    prompt: str
    options: dict[str, Any]
    replica: str = Field(description="The API replica that executes the run.")
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    answer: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    usage: dict[str, int] = Field(default_factory=dict)
    transcript: dict[str, Any] | None = Field(
        None, description="Messages and tool calls so far; complete once the run has ended."
    )


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


class ApiStore:
    """Reads and writes runs, their events, batches and replica leases."""

    def __init__(
        self,
        client: aioredis.Redis,
        *,
        retention_s: int,
        lease_ttl_s: float = 15.0,
        events_maxlen: int = EVENTS_MAXLEN,
    ) -> None:
        self.redis = client
        self.retention_s = retention_s
        self.lease_ttl_s = lease_ttl_s
        self.events_maxlen = events_maxlen
        self._transition = client.register_script(_TRANSITION)

    # -- runs ----------------------------------------------------------------------------------

    async def create_run(
        self, run_id: str, prompt: str, options: Mapping[str, Any], replica: str
    ) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                run_key(run_id),
                mapping={
                    "id": run_id,
                    "status": "queued",
                    "prompt": prompt,
                    "options": json.dumps(options),
                    "replica": replica,
                    "created_at": repr(time.time()),
                },
            )
            pipe.sadd(ACTIVE_RUNS, run_id)
            await pipe.execute()

    async def get_run(self, run_id: str) -> RunState | None:
        fields = await self._hash(run_key(run_id))
        if not fields:
            return None
        if fields["status"] in ACTIVE and await self._reap_run(run_id, fields["replica"]):
            fields = await self._hash(run_key(run_id))
        return _run_state(fields)

    async def mark_running(self, run_id: str) -> bool:
        """queued -> running; False when it was cancelled or reaped before it could start."""
        return await self._apply(
            run_key(run_id),
            events_key(run_id),
            ("queued",),
            {"status": "running"},
            now="started_at",
        )

    async def save_transcript(self, run_id: str, transcript: Mapping[str, Any]) -> None:
        await self._apply(
            run_key(run_id),
            events_key(run_id),
            ("running",),
            {"transcript": json.dumps(transcript)},
        )

    async def add_event(self, run_id: str, event: Mapping[str, Any]) -> str:
        entry = await self.redis.xadd(
            events_key(run_id),
            {"event": json.dumps(event)},
            maxlen=self.events_maxlen,
            approximate=True,
        )
        return _text(entry)

    async def finish_run(
        self,
        run_id: str,
        status: RunStatus,
        *,
        error: str | None = None,
        answer: str | None = None,
        stop_reason: str | None = None,
        transcript: Mapping[str, Any] | None = None,
    ) -> bool:
        """End an active run and append its ``done`` event; False if it had already ended."""
        fields: dict[str, str] = {"status": status}
        if error is not None:
            fields["error"] = error
        if answer is not None:
            fields["answer"] = answer
        if stop_reason is not None:
            fields["stop_reason"] = stop_reason
        if transcript is not None:
            fields["transcript"] = json.dumps(transcript)
        done = {"type": DONE, "status": status, "error": error, "stop_reason": stop_reason}
        return await self._apply(
            run_key(run_id),
            events_key(run_id),
            ACTIVE,
            fields,
            event=done,
            active=(ACTIVE_RUNS, run_id),
            now="finished_at",
        )

    async def read_events(
        self, run_id: str, after: str, *, block_ms: int, count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        """Events after the stream id ``after`` ("0" for all), waiting up to ``block_ms``."""
        reply: Any = await self.redis.xread(
            {events_key(run_id): after}, count=count, block=block_ms or None
        )
        entries: list[tuple[str, dict[str, Any]]] = []
        for _stream, items in reply or []:
            for entry_id, values in items:
                raw = values.get(b"event", values.get("event"))
                entries.append((_text(entry_id), json.loads(raw)))
        return entries

    async def wait_until_ended(self, run_id: str, timeout_s: float) -> RunState | None:
        """The run once it has ended, or as it is when ``timeout_s`` runs out."""
        deadline = time.monotonic() + timeout_s
        last: Any = await self.redis.xrevrange(events_key(run_id), count=1)
        after = _text(last[0][0]) if last else "0"
        while True:
            state = await self.get_run(run_id)
            remaining = deadline - time.monotonic()
            if state is None or state.status not in ACTIVE or remaining <= 0:
                return state
            entries = await self.read_events(run_id, after, block_ms=max(int(remaining * 1000), 1))
            if entries:
                after = entries[-1][0]

    async def request_cancel(
        self, run_id: str
    ) -> RunStatus | Literal["cancelled_now", "cancelling"] | None:
        """Cancel a run: "cancelled_now" if it had not started, "cancelling" if it runs (its
        replica is told), its final status if it had already ended, None if unknown."""
        if await self._apply(
            run_key(run_id),
            events_key(run_id),
            ("queued",),
            {"status": "cancelled"},
            event={"type": DONE, "status": "cancelled", "error": None, "stop_reason": None},
            active=(ACTIVE_RUNS, run_id),
            now="finished_at",
        ):
            return "cancelled_now"
        state = await self.get_run(run_id)
        if state is None:
            return None
        if state.status != "running":
            return state.status
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(cancel_key(run_id), "1", ex=self.retention_s)
            pipe.publish(CANCEL_CHANNEL, run_id)
            await pipe.execute()
        return "cancelling"

    async def cancels_requested(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs someone asked to cancel."""
        if not run_ids:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.exists(cancel_key(run_id))
            found = await pipe.execute()
        return {run_id for run_id, hit in zip(run_ids, found, strict=True) if hit}

    # -- batches -------------------------------------------------------------------------------

    async def create_batch(
        self, batch_id: str, *, total: int, concurrency: int, replica: str
    ) -> None:
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(
                batch_key(batch_id),
                mapping={
                    "id": batch_id,
                    "status": "queued",
                    "total": total,
                    "concurrency": concurrency,
                    "replica": replica,
                    "created_at": repr(time.time()),
                    "done": 0,
                    "ok": 0,
                    "errors": 0,
                    "running": 0,
                },
            )
            pipe.sadd(ACTIVE_BATCHES, batch_id)
            await pipe.execute()

    async def mark_batch_running(self, batch_id: str) -> bool:
        return await self._apply(
            batch_key(batch_id), results_key(batch_id), ("queued",), {"status": "running"}
        )

    async def batch_item_started(self, batch_id: str) -> None:
        await self.redis.hincrby(batch_key(batch_id), "running", 1)

    async def add_batch_result(self, batch_id: str, record: Mapping[str, Any]) -> None:
        ok = record.get("status") == "ok"
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.rpush(results_key(batch_id), json.dumps(record))
            pipe.hincrby(batch_key(batch_id), "done", 1)
            pipe.hincrby(batch_key(batch_id), "ok" if ok else "errors", 1)
            pipe.hincrby(batch_key(batch_id), "running", -1)
            await pipe.execute()

    async def finish_batch(
        self, batch_id: str, status: BatchStatus, *, error: str | None = None
    ) -> bool:
        fields: dict[str, str] = {"status": status, "running": "0"}
        if error is not None:
            fields["error"] = error
        return await self._apply(
            batch_key(batch_id),
            results_key(batch_id),
            ACTIVE,
            fields,
            active=(ACTIVE_BATCHES, batch_id),
            now="finished_at",
        )

    async def get_batch(self, batch_id: str, *, offset: int, limit: int) -> BatchState | None:
        fields = await self._hash(batch_key(batch_id))
        if not fields:
            return None
        if fields["status"] in ACTIVE and await self._reap_batch(batch_id, fields["replica"]):
            fields = await self._hash(batch_key(batch_id))
        raw = await self.redis.lrange(results_key(batch_id), offset, offset + limit - 1)
        return BatchState(
            id=fields["id"],
            status=cast(BatchStatus, fields["status"]),
            concurrency=int(fields["concurrency"]),
            replica=fields["replica"],
            created_at=float(fields["created_at"]),
            finished_at=_float(fields.get("finished_at")),
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

    # -- replicas ------------------------------------------------------------------------------

    async def renew_lease(self, replica: str) -> None:
        await self.redis.set(lease_key(replica), repr(time.time()), px=int(self.lease_ttl_s * 1000))

    async def drop_lease(self, replica: str) -> None:
        await self.redis.delete(lease_key(replica))

    async def reap_orphans(self) -> int:
        """Fail the runs and batches of replicas whose lease expired; returns how many."""
        reaped = 0
        for run_id in await self._members(ACTIVE_RUNS):
            fields = await self._hash(run_key(run_id))
            if not fields:
                await self.redis.srem(ACTIVE_RUNS, run_id)  # expired or deleted by hand
            elif fields["status"] in ACTIVE:
                reaped += await self._reap_run(run_id, fields["replica"])
        for batch_id in await self._members(ACTIVE_BATCHES):
            fields = await self._hash(batch_key(batch_id))
            if not fields:
                await self.redis.srem(ACTIVE_BATCHES, batch_id)
            elif fields["status"] in ACTIVE:
                reaped += await self._reap_batch(batch_id, fields["replica"])
        return reaped

    async def _reap_run(self, run_id: str, replica: str) -> bool:
        if await self.redis.exists(lease_key(replica)):
            return False
        return await self.finish_run(run_id, "failed", error=_lost(replica, "run"))

    async def _reap_batch(self, batch_id: str, replica: str) -> bool:
        if await self.redis.exists(lease_key(replica)):
            return False
        return await self.finish_batch(batch_id, "failed", error=_lost(replica, "batch"))

    # -- helpers -------------------------------------------------------------------------------

    async def _apply(
        self,
        key: str,
        companion: str,
        allowed: Iterable[str],
        fields: Mapping[str, str],
        *,
        event: Mapping[str, Any] | None = None,
        active: tuple[str, str] | None = None,
        now: str | None = None,
    ) -> bool:
        """Set ``fields`` (and ``now`` to the time) if the status is one of ``allowed``.

        ``active`` (set, member) marks an ending: the member leaves the set of active work and
        the keys expire after the retention time.
        """
        fields = dict(fields)
        if now is not None:
            fields[now] = repr(time.time())
        ending = active is not None
        args: list[str | int] = [
            "," + ",".join(allowed) + ",",
            active[1] if active else "",
            self.retention_s if ending else 0,
            json.dumps(event) if event is not None else "",
            self.events_maxlen,
        ]
        for name, value in fields.items():
            args += [name, value]
        set_key = active[0] if active else ACTIVE_RUNS
        applied = await self._transition(keys=[key, companion, set_key], args=args)
        return bool(applied)

    async def _hash(self, key: str) -> dict[str, str]:
        raw = await self.redis.hgetall(key)
        return {_text(name): _text(value) for name, value in raw.items()}

    async def _members(self, key: str) -> list[str]:
        return [_text(member) for member in await self.redis.smembers(key)]


def _lost(replica: str, what: str) -> str:
    return (
        f"the API replica {replica} that executed this {what} stopped (its lease expired) "
        f"before the {what} ended; start it again"
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _float(value: str | None) -> float | None:
    return float(value) if value else None


def _run_state(fields: dict[str, str]) -> RunState:
    transcript = json.loads(fields["transcript"]) if fields.get("transcript") else None
    return RunState(
        id=fields["id"],
        status=cast(RunStatus, fields["status"]),
        prompt=fields["prompt"],
        options=json.loads(fields["options"]),
        replica=fields["replica"],
        created_at=float(fields["created_at"]),
        started_at=_float(fields.get("started_at")),
        finished_at=_float(fields.get("finished_at")),
        answer=fields.get("answer"),
        stop_reason=fields.get("stop_reason"),
        error=fields.get("error"),
        usage=(transcript or {}).get("usage", {}),
        transcript=transcript,
    )


class ReplicaLease:
    """Keeps this replica's lease alive, and fails the work of replicas whose lease expired."""

    def __init__(self, store: ApiStore, replica: str) -> None:
        self._store = store
        self.replica = replica
        self._task: asyncio.Task[None] | None = None
        self._stopping = asyncio.Event()

    async def start(self) -> None:
        await self._store.renew_lease(self.replica)
        self._task = asyncio.create_task(self._keep(), name="toolq-lease")

    async def stop(self) -> None:
        # An event, not a cancellation: redis-py on Python 3.11 can lose a cancellation.
        self._stopping.set()
        if self._task is not None:
            await self._task
            self._task = None
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
            await self._store.drop_lease(self.replica)

    async def _keep(self) -> None:
        interval = self._store.lease_ttl_s / 3
        while not self._stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), interval)
            if self._stopping.is_set():
                return
            try:
                await self._store.renew_lease(self.replica)
                reaped = await self._store.reap_orphans()
                if reaped:
                    log.warning("marked %d runs or batches of stopped replicas as failed", reaped)
            except (RedisError, OSError) as exc:
                log.warning("replica lease: %s", exc)
