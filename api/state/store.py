"""The API's state store, shared by every replica: runs, batches, and replicas' leases.

Each replica holds a lease (``toolq:api:replica:<id>``), kept alive in the background; the runs
and batches of a replica whose lease expired are marked failed, by whichever replica notices
first.
"""

from __future__ import annotations

import contextlib
import logging
import time

from redis.exceptions import RedisError

from api.state.batches import BatchStore
from api.state.periodic import Periodic
from api.state.records import ACTIVE, text
from api.state.runs import RunStore
from worker.contract.keys import (
    ACTIVE_BATCHES,
    ACTIVE_RUNS,
    batch_state_key,
    replica_lease_key,
    run_state_key,
)

log = logging.getLogger(__name__)

#: Seconds a replica's lease lasts unless renewed (it is, every third of that).
LEASE_TTL_S = 15.0


class ApiStore(RunStore, BatchStore):
    """Reads and writes runs, their events, batches and replica leases."""

    async def renew_lease(self, replica: str) -> None:
        await self.redis.set(
            replica_lease_key(replica), repr(time.time()), px=int(LEASE_TTL_S * 1000)
        )

    async def reap_orphans(self) -> int:
        """Fail the runs and batches of replicas whose lease expired; returns how many."""
        reaped = 0
        kinds = (
            (ACTIVE_RUNS, run_state_key, self._reap_run),
            (ACTIVE_BATCHES, batch_state_key, self._reap_batch),
        )
        for active_set, state_key, reap in kinds:
            for record_id in map(text, await self.redis.smembers(active_set)):
                fields = await self._hash(state_key(record_id))
                if not fields:
                    await self.redis.srem(active_set, record_id)  # expired or deleted by hand
                elif fields["status"] in ACTIVE:
                    reaped += await reap(record_id, fields["replica"])
        return reaped


class ReplicaLease:
    """Keeps this replica's lease alive, and fails the work of replicas whose lease expired."""

    def __init__(self, store: ApiStore, replica: str) -> None:
        self._store = store
        self.replica = replica
        self._keeper = Periodic(
            self._renew, LEASE_TTL_S / 3, name="toolq-lease", failing="replica lease"
        )

    async def start(self) -> None:
        await self._store.renew_lease(self.replica)
        self._keeper.start()

    async def stop(self) -> None:
        await self._keeper.stop()
        with contextlib.suppress(RedisError, OSError):  # it expires by itself
            await self._store.redis.delete(replica_lease_key(self.replica))

    async def _renew(self) -> None:
        await self._store.renew_lease(self.replica)
        reaped = await self._store.reap_orphans()
        if reaped:
            log.warning("marked %d runs or batches of stopped replicas as failed", reaped)
