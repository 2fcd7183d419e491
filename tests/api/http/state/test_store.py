"""The state store and the work of replicas that died: failed with the reason, once."""

from __future__ import annotations

import fakeredis
import httpx

from api.state.store import ApiStore
from tests.api.http.conftest import fake_redis, sse_events


async def test_a_run_whose_replica_died_is_failed_with_the_reason(
    client: httpx.AsyncClient, fake_server: fakeredis.FakeServer
) -> None:
    store = ApiStore(fake_redis(fake_server), retention_s=60)
    await store.create_run("run-orphan", "p", {}, replica="gone-replica")
    await store.mark_running("run-orphan")
    run = (await client.get("/v1/runs/run-orphan")).json()
    assert run["status"] == "failed"
    assert "gone-replica" in run["error"] and "lease expired" in run["error"]
    events = sse_events((await client.get("/v1/runs/run-orphan/events")).text)
    assert events == [{**events[0], "type": "done", "status": "failed"}]
    assert (await client.post("/v1/runs/run-orphan/cancel")).status_code == 409


async def test_the_lease_keeper_fails_the_work_of_dead_replicas_only(
    client: httpx.AsyncClient, fake_server: fakeredis.FakeServer
) -> None:
    store = ApiStore(fake_redis(fake_server), retention_s=60)
    await store.renew_lease("alive")
    await store.create_run("run-alive", "p", {}, replica="alive")
    await store.create_run("run-dead", "p", {}, replica="dead")
    await store.create_batch("batch-dead", total=2, concurrency=1, replica="dead")
    assert await store.reap_orphans() == 2
    assert await store.reap_orphans() == 0  # once is enough
    assert (await client.get("/v1/runs/run-alive")).json()["status"] == "queued"
    assert (await client.get("/v1/runs/run-dead")).json()["status"] == "failed"
    batch = (await client.get("/v1/batches/batch-dead")).json()
    assert batch["status"] == "failed"
    assert "dead" in batch["error"]
