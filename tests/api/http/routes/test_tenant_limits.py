"""A tenant's own maximums for its runs' limits (TOOLQ_TENANT_LIMITS_MAX): a run or batch line
asking more is refused with 422 naming the field, and nothing of it starts; another tenant, and
a field the tenant leaves out, keep the fleet's maximums."""

from __future__ import annotations

from pathlib import Path

import fakeredis
import httpx

from tests.api.http.conftest import StubExecutor, serving
from tests.api.http.routes.test_network import ALICE, BOB, bearer, tenants_app
from worker.contract.run_limits import LimitsMax

#: Alice's own maximum memory; her pids, and all of bob's, are the fleet's.
ALICE_256_MB = {"alice": LimitsMax.model_validate({"memory_mb": 256})}


async def post_run(client: httpx.AsyncClient, limits: dict[str, float]) -> httpx.Response:
    return await client.post("/v1/runs", json={"prompt": "p", "options": {"limits": limits}})


async def test_a_tenant_gets_no_more_than_its_own_maximums(
    fake_server: fakeredis.FakeServer, tmp_path: Path
) -> None:
    stub = StubExecutor()
    app = tenants_app(fake_server, tmp_path, stub, tenant_limits_max=ALICE_256_MB)
    async with serving(app, bearer(ALICE)) as alice:
        refused = await post_run(alice, {"memory_mb": 512})
        batch = await alice.post(
            "/v1/batches",
            json={"items": [{"id": "a", "prompt": "p", "limits": {"memory_mb": 300}}]},
        )
        within = await post_run(alice, {"memory_mb": 256, "pids": 1000})
        above_the_fleet = await post_run(alice, {"memory_mb": 999999})
    async with serving(app, bearer(BOB)) as bob:
        other = await post_run(bob, {"memory_mb": 512})
    assert refused.status_code == 422
    [error] = refused.json()["errors"]
    assert error["field"] == "options.limits"
    assert error["message"] == (
        "the run asks more than tenant alice may (TOOLQ_TENANT_LIMITS_MAX): "
        "memory_mb=512 (at most 256)"
    )
    assert batch.status_code == 422
    [error] = batch.json()["errors"]
    assert error["field"] == "items.0.limits"
    assert "memory_mb=300 (at most 256)" in error["message"]
    assert stub.batches == []
    # pids is not among alice's own: the fleet's 1024 holds; bob keeps the fleet's memory.
    assert within.status_code == 202, within.text
    assert other.status_code == 202, other.text
    # Above the fleet's maximum too: the fleet's is said.
    assert above_the_fleet.json()["errors"][0]["message"] == (
        "the run asks more than this fleet allows: memory_mb=999999 (at most 4096)"
    )
    assert [run[2].limits.memory_mb for run in stub.runs if run[2].limits] == [256, 512]
