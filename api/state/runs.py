"""Runs in Redis: a hash per run (``toolq:api:run:<id>``) and a stream of its events.

A run read while active whose replica's lease has expired is failed there and then, so a reader
never waits on a run nobody executes.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal, cast

from pydantic import BaseModel, Field

from api.state.listing import Listed, ListQuery, list_current, record_tags
from api.state.records import (
    ACTIVE,
    DONE,
    EVENTS_MAXLEN,
    HashFields,
    RecordStore,
    lost_error,
    optional_float,
    text,
)
from api.state.redis_clients import bounded_block_ms
from api.state.run_end import RunEnd
from worker.contract.keys import (
    ACTIVE_RUNS,
    CANCEL_CHANNEL,
    DEFAULT_TENANT,
    run_cancel_key,
    run_events_key,
    run_state_key,
    runs_index_key,
)

RunStatus = Literal["queued", "running", "succeeded", "failed", "cancelled"]


#: A cancelled run's error, wherever it ran.
CANCELLED_ERROR = "cancelled on request"


class RunSummary(BaseModel):
    """A run as ``GET /v1/runs`` lists it: all but its transcript."""

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
    tags: list[str] = Field(default_factory=list, description="What the run was started with.")
    orchestrator: str | None = Field(
        None,
        description="host:pid of the process that ran the conversation: an agents worker, or "
        "the replica itself when no agents worker was live; set once the run has ended.",
    )
    attempts: int | None = Field(
        None,
        description="Runs of the conversation on the agents pool: more than 1 when an agents "
        "worker died and another ran it again from the start.",
    )


class RunState(RunSummary):
    """What ``GET /v1/runs/{id}`` answers."""

    transcript: dict[str, Any] | None = Field(
        None, description="Messages and tool calls so far; complete once the run has ended."
    )


class RunStore(RecordStore):
    """Reads and writes runs and their events."""

    async def create_run(
        self,
        run_id: str,
        prompt: str,
        options: Mapping[str, Any],
        replica: str,
        *,
        tenant: str = DEFAULT_TENANT,
        tags: Sequence[str] = (),
    ) -> None:
        fields: HashFields = {
            "prompt": prompt,
            "options": json.dumps(options),
            "replica": replica,
            "tenant": tenant,
            "tags": json.dumps(list(tags)),
        }
        await self._create(
            run_state_key(run_id), run_id, fields, ACTIVE_RUNS, runs_index_key(tenant)
        )

    async def get_run(self, run_id: str, *, tenant: str | None = None) -> RunState | None:
        """The run, or None when there is none, or when it is not ``tenant``'s (None: whoever's):
        another tenant's run is answered as an unknown one is."""
        fields = await self._run_fields(run_id, tenant)
        return None if fields is None else _run_state(fields)

    async def list_runs(
        self, query: ListQuery, *, tenant: str = DEFAULT_TENANT
    ) -> Listed[RunSummary]:
        """A page of ``tenant``'s runs still kept, newest first, as ``query`` filters them."""
        index = runs_index_key(tenant)
        listed = await list_current(
            self.redis, index, run_state_key, query, tenant, self._run_fields
        )
        return listed.map(lambda fields: _summary(_run_state(fields)))

    async def mark_running(self, run_id: str) -> bool:
        """queued -> running; False when it was cancelled or reaped before it could start."""
        return await self._apply(
            run_state_key(run_id),
            run_events_key(run_id),
            ("queued",),
            {"status": "running"},
            now="started_at",
        )

    async def save_transcript(
        self, run_id: str, transcript: Mapping[str, Any], *, final: bool = False
    ) -> None:
        """The transcript so far, while the run is going; a ``final`` one whatever its status,
        as the agents worker that ran it may save it after its replica recorded the end."""
        await self._apply(
            run_state_key(run_id),
            run_events_key(run_id),
            ("running", "succeeded", "failed", "cancelled") if final else ("running",),
            {"transcript": json.dumps(transcript)},
        )

    async def add_event(self, run_id: str, event: Mapping[str, Any]) -> str:
        entry = await self.redis.xadd(
            run_events_key(run_id),
            {"event": json.dumps(event)},
            maxlen=EVENTS_MAXLEN,
            approximate=True,
        )
        return text(entry)

    async def finish_run(self, run_id: str, ending: RunEnd) -> bool:
        """End an active run and append its ``done`` event; False if it had already ended."""
        kept = {"status", "orchestrator", "attempts", "error", "answer", "stop_reason"}
        given = ending.model_dump(include=kept, exclude_none=True)
        fields = {name: str(value) for name, value in given.items()}
        if ending.transcript is not None:
            fields["transcript"] = json.dumps(ending.transcript)
        done = {
            "type": DONE,
            "status": ending.status,
            "error": ending.error,
            "stop_reason": ending.stop_reason,
        }
        return await self._apply(
            run_state_key(run_id),
            run_events_key(run_id),
            ACTIVE,
            fields,
            event=done,
            active=(ACTIVE_RUNS, run_id),
            now="finished_at",
        )

    async def read_events(
        self, run_id: str, after: str, *, block_ms: int, count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        """Events after the stream id ``after`` ("0" for all), waiting up to ``block_ms`` (cut
        to what one blocking read may wait: ``bounded_block_ms``)."""
        block = bounded_block_ms(self.redis, block_ms) if block_ms else None
        reply: Any = await self.redis.xread(
            {run_events_key(run_id): after}, count=count, block=block
        )
        return [entry for _stream, items in reply or [] for entry in event_entries(items)]

    async def wait_until_ended(self, run_id: str, timeout_s: float) -> RunState | None:
        """The run once it has ended, or as it is when ``timeout_s`` runs out."""
        deadline = time.monotonic() + timeout_s
        last: Any = await self.redis.xrevrange(run_events_key(run_id), count=1)
        after = text(last[0][0]) if last else "0"
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
            run_state_key(run_id),
            run_events_key(run_id),
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
            pipe.set(run_cancel_key(run_id), "1", ex=self.retention_s)
            pipe.publish(CANCEL_CHANNEL, run_id)
            await pipe.execute()
        return "cancelling"

    async def cancels_requested(self, run_ids: Sequence[str]) -> set[str]:
        """Which of these runs someone asked to cancel."""
        if not run_ids:
            return set()
        async with self.redis.pipeline(transaction=False) as pipe:
            for run_id in run_ids:
                pipe.exists(run_cancel_key(run_id))
            found = await pipe.execute()
        return {run_id for run_id, hit in zip(run_ids, found, strict=True) if hit}

    async def _run_fields(self, run_id: str, tenant: str | None = None) -> dict[str, str] | None:
        reap = functools.partial(self._reap_run, run_id)
        return await self._current(run_state_key(run_id), reap, tenant)

    async def _reap_run(self, run_id: str, replica: str) -> bool:
        """Fail an active run whose replica's lease expired; True if this ended it."""
        if not await self._lease_expired(replica):
            return False
        return await self.finish_run(
            run_id, RunEnd(status="failed", error=lost_error(replica, "run"))
        )


def event_entries(
    items: Sequence[tuple[bytes | str, Mapping[Any, Any]]],
) -> list[tuple[str, dict[str, Any]]]:
    """A run's stream entries as XREAD answers them, as (stream id, event) pairs."""
    return [
        (text(entry_id), json.loads(values.get(b"event", values.get("event"))))
        for entry_id, values in items
    ]


def _summary(run: RunState) -> RunSummary:
    return RunSummary.model_validate(run.model_dump(exclude={"transcript"}))


def _run_state(fields: dict[str, str]) -> RunState:
    transcript = json.loads(fields["transcript"]) if fields.get("transcript") else None
    return RunState(
        id=fields["id"],
        status=cast(RunStatus, fields["status"]),
        prompt=fields["prompt"],
        options=json.loads(fields["options"]),
        replica=fields["replica"],
        created_at=float(fields["created_at"]),
        started_at=optional_float(fields.get("started_at")),
        finished_at=optional_float(fields.get("finished_at")),
        answer=fields.get("answer"),
        stop_reason=fields.get("stop_reason"),
        error=fields.get("error"),
        usage=_with_network((transcript or {}).get("usage", {}), transcript),
        tags=record_tags(fields),
        transcript=transcript,
        orchestrator=fields.get("orchestrator"),
        attempts=int(fields["attempts"]) if fields.get("attempts") else None,
    )


def _with_network(usage: dict[str, int], transcript: dict[str, Any] | None) -> dict[str, int]:
    """The run's usage, with the connections its network allowed and refused added up over
    its calls (``network_allowed``, ``network_refused``) where any call had a network."""
    counted = [
        call["usage"]
        for call in (transcript or {}).get("tool_calls") or []
        if isinstance(call, dict)
        and isinstance(call.get("usage"), dict)
        and isinstance(call["usage"].get("network_allowed"), int)
    ]
    if not counted:
        return usage
    return {
        **usage,
        "network_allowed": sum(int(u["network_allowed"]) for u in counted),
        "network_refused": sum(int(u.get("network_refused") or 0) for u in counted),
    }
