"""The API's state store, shared by every replica: runs, batches, and replicas' leases.

Each replica holds a lease (``toolq:api:replica:<id>``); the runs and batches of a replica whose
lease expired are marked failed, by whichever replica notices first.
"""

from __future__ import annotations

import time

from api.http.state.batches import BatchStore
from api.http.state.keys import (
    ACTIVE,
    ACTIVE_BATCHES,
    ACTIVE_RUNS,
    batch_state_key,
    replica_lease_key,
    run_state_key,
)
from api.http.state.runs import RunStore


class ApiStore(RunStore, BatchStore):
    """Reads and writes runs, their events, batches and replica leases."""

    async def renew_lease(self, replica: str) -> None:
        await self.redis.set(
            replica_lease_key(replica), repr(time.time()), px=int(self.lease_ttl_s * 1000)
        )

    async def drop_lease(self, replica: str) -> None:
        await self.redis.delete(replica_lease_key(replica))

    async def reap_orphans(self) -> int:
        """Fail the runs and batches of replicas whose lease expired; returns how many."""
        reaped = 0
        for run_id in await self._members(ACTIVE_RUNS):
            fields = await self._hash(run_state_key(run_id))
            if not fields:
                await self.redis.srem(ACTIVE_RUNS, run_id)  # expired or deleted by hand
            elif fields["status"] in ACTIVE:
                reaped += await self._reap_run(run_id, fields["replica"])
        for batch_id in await self._members(ACTIVE_BATCHES):
            fields = await self._hash(batch_state_key(batch_id))
            if not fields:
                await self.redis.srem(ACTIVE_BATCHES, batch_id)
            elif fields["status"] in ACTIVE:
                reaped += await self._reap_batch(batch_id, fields["replica"])
        return reaped
