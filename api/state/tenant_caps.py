"""Per-tenant caps on what holds a sandbox uid: live runs and MCP sessions.

Each run on the fleet holds one uid of the sandbox workers' range while it lives, so one tenant
starting runs without end would leave none for the others. A tenant holds at most
``TOOLQ_TENANT_MAX_RUNS`` live runs (its runs, and the conversations its batches run at once) and
``TOOLQ_TENANT_MAX_MCP_SESSIONS`` MCP sessions; one more is refused before anything of it is made.

What a tenant holds is counted in Redis, so that replicas sharing it share the count, and taken
in one script, so two replicas cannot both take the last place. A tenant's holdings of a kind are
a sorted set whose members are scored by when their lease ends: the replica holding them renews
the lease while it lives, and the places of a replica that died free themselves when it runs out.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass

import redis.asyncio as aioredis
from redis.exceptions import RedisError

from api.settings import OrchestratorSettings
from api.state.periodic import Periodic
from worker.contract.errors import ToolqError
from worker.contract.keys import tenant_holdings_key

log = logging.getLogger(__name__)

#: How long a place stays taken without its replica renewing it.
LEASE_S = 60.0

# KEYS[1]: the tenant's holdings; ARGV: the cap (0: none), the lease in ms, then the holders.
# Returns {1, held} when taken, {0, held} when the cap leaves no room for them all.
_TAKE = """
local now = redis.call('TIME')
local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now_ms)
local held = redis.call('ZCARD', KEYS[1])
local cap = tonumber(ARGV[1])
local wanted = #ARGV - 2
if cap > 0 and held + wanted > cap then
  return {0, held}
end
local lease_ms = tonumber(ARGV[2])
for i = 3, #ARGV do
  redis.call('ZADD', KEYS[1], now_ms + lease_ms, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], lease_ms)
return {1, held + wanted}
"""

# KEYS[1]: the tenant's holdings; ARGV: the lease in ms, then the holders still held.
_RENEW = """
local now = redis.call('TIME')
local until_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000) + tonumber(ARGV[1])
for i = 2, #ARGV do
  redis.call('ZADD', KEYS[1], 'XX', until_ms, ARGV[i])
end
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]))
return 0
"""


@dataclass(frozen=True, slots=True)
class Cap:
    """One capped kind of holding, and how refusals name it."""

    kind: str
    variable: str
    noun: str


RUNS = Cap("runs", "TOOLQ_TENANT_MAX_RUNS", "live runs")
MCP_SESSIONS = Cap("mcp-sessions", "TOOLQ_TENANT_MAX_MCP_SESSIONS", "MCP sessions")


class CapReached(ToolqError):
    """A tenant asked for more than its cap leaves; the message is one line naming the cap."""

    def __init__(self, tenant: str, cap: Cap, limit: int, held: int, wanted: int) -> None:
        more = "one more" if wanted == 1 else f"{wanted} more at once"
        super().__init__(
            f"tenant {tenant!r} holds {held} {cap.noun} and may hold at most {limit} "
            f"({cap.variable}={limit}), so {more} is refused: try again once one has ended"
        )
        self.cap = cap
        self.limit = limit


@dataclass(frozen=True, slots=True)
class Holding:
    """Places taken by one tenant, to give back once what holds them has ended."""

    key: str
    holders: tuple[str, ...]


class TenantCaps:
    """Takes and gives back tenants' places, and renews the leases of those this replica holds."""

    def __init__(
        self, redis: aioredis.Redis, settings: OrchestratorSettings, *, lease_s: float = LEASE_S
    ) -> None:
        self._redis = redis
        self._limits = {
            RUNS.kind: settings.tenant_max_runs,
            MCP_SESSIONS.kind: settings.tenant_max_mcp_sessions,
        }
        self._lease_ms = int(lease_s * 1000)
        self._held: dict[str, set[str]] = {}
        self._renewer = Periodic(
            self.renew,
            lease_s / 3,
            name="toolq-tenant-caps",
            failing="tenant places: could not renew their lease",
        )

    def limit(self, cap: Cap) -> int:
        return self._limits[cap.kind]

    async def take(self, cap: Cap, tenant: str, count: int = 1) -> Holding:
        """``count`` places of ``cap`` for ``tenant``, all or none (``CapReached``)."""
        key = tenant_holdings_key(cap.kind, tenant)
        holders = tuple(f"{cap.kind}-{uuid.uuid4().hex}" for _ in range(count))
        if count == 0:
            return Holding(key, holders)
        taken, held = await self._redis.eval(
            _TAKE, 1, key, self.limit(cap), self._lease_ms, *holders
        )
        if not taken:
            raise CapReached(tenant, cap, self.limit(cap), int(held), count)
        self._held.setdefault(key, set()).update(holders)
        return Holding(key, holders)

    async def give_back(self, holding: Holding) -> None:
        """The places are free again; a lost Redis lets them go when their lease ends."""
        held = self._held.get(holding.key, set())
        held.difference_update(holding.holders)
        if not held:
            self._held.pop(holding.key, None)
        if not holding.holders:
            return
        try:
            await self._redis.zrem(holding.key, *holding.holders)
        except (RedisError, OSError) as exc:
            log.warning("tenant places stay taken until their lease ends: %s", exc)

    async def held(self, cap: Cap, tenant: str) -> int:
        """How many places of ``cap`` ``tenant`` holds now, on every replica."""
        key = tenant_holdings_key(cap.kind, tenant)
        now_s, now_us = await self._redis.time()
        return int(await self._redis.zcount(key, f"({now_s * 1000 + now_us // 1000}", "+inf"))

    async def start(self) -> None:
        self._renewer.start()

    async def stop(self) -> None:
        await self._renewer.stop()

    async def renew(self) -> None:
        """Every place this replica holds stays taken for another lease."""
        for key, holders in list(self._held.items()):
            if holders:
                await self._redis.eval(_RENEW, 1, key, self._lease_ms, *sorted(holders))
