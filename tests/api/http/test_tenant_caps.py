"""A tenant holds at most TOOLQ_TENANT_MAX_RUNS live runs: tried as a tenant that would take
the whole uid range. One more run or batch is refused with 429 naming the cap, before anything is
made; other tenants start runs as before; a place is free again once a run ends, on any replica.

Redis is a real redis-server (a database of these tests' own); in the last test, two real
`toolq serve` replicas share the fleet's Redis and run conversations on real workers.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from api.http.app import create_app
from api.scripted.server import ScriptedServer
from api.state.tenant_caps import RUNS, CapReached, TenantCaps
from tests.api.http.conftest import StubExecutor, api_settings, emptied_database
from tests.api.http.serving import Replica, serve_environment, two_replicas
from tests.api.http.test_tenants import bearer, callers_of, tokens_file
from tests.conftest import RedisServer, WorkerFleet, wait_for

#: A database of the session's redis-server that only these tests use.
DATABASE = 14
CAP = 2
ALICE = "alice-0123456789abcdef"
BOB = "bob-fedcba9876543210xyz"
TOKENS = f"alice {ALICE}\nbob {BOB}\n"
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "stall": [{"content": "too late", "fault": {"kind": "stall", "seconds": 60}}],
}


@pytest.fixture
async def state(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    async with emptied_database(redis_server, DATABASE) as client:
        yield client


def start(client: httpx.AsyncClient, **body: Any) -> Any:
    return client.post("/v1/runs", json={"prompt": "hold a uid", **body})


async def test_a_tenant_at_its_cap_is_refused_in_one_line_before_anything_is_made(
    state: aioredis.Redis, stub: StubExecutor, tmp_path: Path
) -> None:
    settings = api_settings(
        api_token=None, api_tokens_file=tokens_file(tmp_path, TOKENS), tenant_max_runs=CAP
    )
    app = create_app(settings, redis=state, executor=lambda *_: stub)
    async with callers_of(app, ALICE, BOB) as (alice, bob, _):
        held = [(await start(alice)).json()["id"] for _ in range(CAP)]

        refused = await start(alice)
        assert refused.status_code == 429
        detail = refused.json()["detail"]
        assert f"TOOLQ_TENANT_MAX_RUNS={CAP}" in detail
        assert f"holds {CAP} live runs" in detail
        batch = await alice.post("/v1/batches", json={"items": [{"id": "a", "prompt": "p"}]})
        assert batch.status_code == 429
        assert f"TOOLQ_TENANT_MAX_RUNS={CAP}" in batch.json()["detail"]
        # Nothing of the refused ones was made or handed to the executor.
        assert (await alice.get("/v1/runs")).json()["total"] == CAP
        assert (await alice.get("/v1/batches")).json()["total"] == 0
        assert len(stub.runs) == CAP

        assert (await start(bob)).status_code == 202  # another tenant is not held back

        await stub.run_ends[held[0]]()  # one of alice's runs ends
        assert (await start(alice)).status_code == 202


async def test_a_batch_takes_a_place_for_each_conversation_it_runs_at_once(
    state: aioredis.Redis, stub: StubExecutor, tmp_path: Path
) -> None:
    settings = api_settings(
        api_token=None, api_tokens_file=tokens_file(tmp_path, TOKENS), tenant_max_runs=3
    )
    app = create_app(settings, redis=state, executor=lambda *_: stub)
    items = [{"id": str(n), "prompt": "p"} for n in range(5)]
    async with callers_of(app, ALICE) as (alice, _):
        wide = await alice.post("/v1/batches", json={"items": items, "concurrency": 4})
        assert wide.status_code == 429, wide.text
        assert "4 more at once" in wide.json()["detail"]
        narrow = await alice.post("/v1/batches", json={"items": items, "concurrency": 2})
        assert narrow.status_code == 202, narrow.text
        assert (await start(alice)).status_code == 202
        assert (await start(alice)).status_code == 429


async def test_the_places_of_a_replica_that_died_free_themselves(
    state: aioredis.Redis,
) -> None:
    settings = api_settings(tenant_max_runs=1)
    # A replica that took a place, then stopped renewing it (it died).
    dead = TenantCaps(state, settings, lease_s=0.2)
    await dead.take(RUNS, "alice")
    alive = TenantCaps(state, settings)
    with pytest.raises(CapReached):
        await alive.take(RUNS, "alice")

    for _ in range(600):  # up to 30 s: the lease ends by Redis's clock
        if await alive.held(RUNS, "alice") == 0:
            break
        await asyncio.sleep(0.05)
    await alive.take(RUNS, "alice")
    assert await alive.held(RUNS, "alice") == 1


# --- two real replicas, one Redis ---------------------------------------------------------


@pytest.fixture(scope="module")
def tenant_names() -> tuple[str, str]:
    """Tenants of this module's own: the fleet's Redis is every module's."""
    suffix = uuid.uuid4().hex[:6]
    return f"alice-{suffix}", f"bob-{suffix}"


@pytest.fixture(scope="module")
def replicas(
    fleet: WorkerFleet,
    model: ScriptedServer,
    tmp_path_factory: pytest.TempPathFactory,
    tenant_names: tuple[str, str],
) -> Iterator[tuple[Replica, Replica]]:
    folder = tmp_path_factory.mktemp("capped")
    alice, bob = tenant_names
    tokens = tokens_file(folder, f"{alice} {ALICE}\n{bob} {BOB}\n")
    env = serve_environment(fleet, model, ALICE)
    env.pop("TOOLQ_API_TOKEN")
    env |= {"TOOLQ_API_TOKENS_FILE": str(tokens), "TOOLQ_TENANT_MAX_RUNS": str(CAP)}
    with two_replicas(env, folder, ALICE) as replicas:
        yield replicas


@pytest.mark.integration
def test_the_cap_holds_across_replicas_and_a_run_that_ends_frees_its_place(
    replicas: tuple[Replica, Replica],
) -> None:
    first, second = replicas

    def stalled() -> dict[str, Any]:
        # A prompt of its own: the model stalls once for each conversation.
        return {"prompt": uuid.uuid4().hex, "options": {"model": "scripted:stall"}}

    held = [replica.client.post("/v1/runs", json=stalled()) for replica in replicas]
    assert [answer.status_code for answer in held] == [202, 202], [a.text for a in held]
    run_ids = [answer.json()["id"] for answer in held]

    for replica in replicas:  # counted in Redis: neither replica lets alice have a third
        refused = replica.client.post("/v1/runs", json=stalled())
        assert refused.status_code == 429, refused.text
        assert f"TOOLQ_TENANT_MAX_RUNS={CAP}" in refused.json()["detail"]

    bob = second.client.post("/v1/runs", json={"prompt": "p"}, headers=bearer(BOB))
    assert bob.status_code == 202, bob.text

    cancelled = first.client.post(f"/v1/runs/{run_ids[0]}/cancel")
    assert cancelled.status_code in (200, 202), cancelled.text
    first.wait_status(run_ids[0], "cancelled")

    def starts_again() -> bool:
        answer = second.client.post("/v1/runs", json=stalled())
        if answer.status_code == 202:
            run_ids.append(answer.json()["id"])
        return answer.status_code == 202

    wait_for(starts_again, 30, "alice's ended run to give its place back")
    for run_id in run_ids[1:]:
        for replica in replicas:
            replica.client.post(f"/v1/runs/{run_id}/cancel")
