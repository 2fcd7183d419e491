"""The API's state store, shared by every replica: runs, batches, and replicas' leases.

Each replica holds a lease (``toolq:api:replica:<id>``); the runs and batches of a replica whose
lease expired are marked failed, by whichever replica notices first.
"""

from __future__ import annotations

import time

from api.state.batches import BatchStore
from api.state.runs import RunStore
from api.state.statuses import ACTIVE
from worker.contract.keys import (
    ACTIVE_BATCHES,
    ACTIVE_RUNS,
    batch_state_key,
    replica_lease_key,
    run_state_key,
)


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
        kinds = (
            (ACTIVE_RUNS, run_state_key, self._reap_run),
            (ACTIVE_BATCHES, batch_state_key, self._reap_batch),
        )
        for active_set, state_key, reap in kinds:
            for record_id in await self._members(active_set):
                fields = await self._hash(state_key(record_id))
                if not fields:
                    await self.redis.srem(active_set, record_id)  # expired or deleted by hand
                elif fields["status"] in ACTIVE:
                    reaped += await reap(record_id, fields["replica"])
        return reaped
