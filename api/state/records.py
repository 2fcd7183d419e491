"""Records in Redis whose status changes in one step: the ground the run and batch stores share.

Status changes go through one Lua script that applies them only from the statuses allowed, so a
run or a batch ends once, whoever (its replica, a cancel, or the reaper of a dead replica) gets
there first.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import redis.asyncio as aioredis
from redis.commands.core import AsyncScript
from redis.typing import EncodableT, FieldT

from worker.contract.keys import ACTIVE_RUNS, DEFAULT_TENANT, replica_lease_key

#: The statuses of work not yet ended, runs and batches alike.
ACTIVE: tuple[str, ...] = ("queued", "running")
#: The type of the event that ends a run's stream.
DONE = "done"
#: A hash's fields and values, as redis-py writes them.
HashFields = dict[FieldT, EncodableT]

#: Events kept per run; a late reader of a longer run misses the oldest text deltas only.
EVENTS_MAXLEN = 10_000
#: How many runs and batches each index keeps; older ones drop out of the lists.
INDEX_SIZE = 10_000

# KEYS: state hash, companion key (events stream or results list), active set, then any other
#       key that expires with the record.
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
  for i = 4, #KEYS do
    redis.call('EXPIRE', KEYS[i], ARGV[3])
  end
end
return 1
"""


@dataclass(eq=False)
class RecordStore:
    """The Redis client, how long ended work is kept, and the one way a status changes."""

    redis: aioredis.Redis
    _: KW_ONLY
    retention_s: int
    _transition: AsyncScript = field(init=False)

    def __post_init__(self) -> None:
        self._transition = self.redis.register_script(_TRANSITION)

    async def _create(
        self, key: str, record_id: str, fields: HashFields, active_set: str, index: str
    ) -> None:
        """A new record, queued, in its set of active work (where the reaper will find it) and
        in its index (where the lists of the API and the viewer find it)."""
        now = time.time()
        record: HashFields = {"id": record_id, "status": "queued", "created_at": repr(now)}
        record.update(fields)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping=record)
            pipe.sadd(active_set, record_id)
            pipe.zadd(index, {record_id: now})
            pipe.zremrangebyrank(index, 0, -INDEX_SIZE - 1)
            await pipe.execute()

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
        expiring: Sequence[str] = (),
    ) -> bool:
        """Set ``fields`` (and ``now`` to the time) if the status is one of ``allowed``.

        ``active`` (set, member) marks an ending: the member leaves the set of active work and
        the keys (and those in ``expiring``) expire after the retention time.
        """
        fields = dict(fields)
        if now is not None:
            fields[now] = repr(time.time())
        args: list[str | int] = [
            "," + ",".join(allowed) + ",",
            active[1] if active else "",
            self.retention_s if active else 0,
            json.dumps(event) if event is not None else "",
            EVENTS_MAXLEN,
        ]
        for name, value in fields.items():
            args += [name, value]
        set_key = active[0] if active else ACTIVE_RUNS
        return bool(await self._transition(keys=[key, companion, set_key, *expiring], args=args))

    async def _current(
        self, key: str, reap: Callable[[str], Awaitable[bool]], tenant: str | None = None
    ) -> dict[str, str] | None:
        """The record's fields; None when there is none, or when it is not ``tenant``'s (None:
        whoever's). One still active is read again if ``reap`` (given its replica) ended it."""
        fields = await self._hash(key)
        if not fields or not owned_by(fields, tenant):
            return None
        if fields["status"] in ACTIVE and await reap(fields["replica"]):
            fields = await self._hash(key)
        return fields

    async def _hash(self, key: str) -> dict[str, str]:
        raw = await self.redis.hgetall(key)
        return {text(name): text(value) for name, value in raw.items()}

    async def _lease_expired(self, replica: str) -> bool:
        return not await self.redis.exists(replica_lease_key(replica))


def lost_error(replica: str, what: str) -> str:
    """Why a run or batch failed when the replica executing it went away."""
    return (
        f"the API replica {replica} that executed this {what} stopped (its lease expired) "
        f"before the {what} ended; start it again"
    )


def owned_by(fields: Mapping[str, str], tenant: str | None) -> bool:
    """Whether a record (its fields) is ``tenant``'s; any record is when ``tenant`` is None.
    Records written before tenants have no ``tenant`` field: they are the default tenant's."""
    return tenant is None or fields.get("tenant", DEFAULT_TENANT) == tenant


def text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def optional_float(value: str | None) -> float | None:
    return float(value) if value else None
