"""A run's network through the HTTP API: what TOOLQ_NETWORK_ALLOWED (and a tenant's
TOOLQ_TENANT_NETWORK_ALLOWED) does not permit is refused with 422 naming the field, and nothing
of the run or batch is started; what it permits reaches the run's options as written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fakeredis
import httpx
from fastapi import FastAPI

from api.http.app import create_app
from tests.api.http.conftest import StubExecutor, api_settings, fake_redis, serving

ALICE = "alice-0123456789abcdef"
BOB = "bob-fedcba9876543210xyz"


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def tenants_app(
    fake_server: fakeredis.FakeServer, tmp_path: Path, stub: StubExecutor, **settings: Any
) -> FastAPI:
    """The API with tenants alice and bob (their tokens ALICE and BOB) and ``settings``."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    configured = api_settings(api_token=None, api_tokens_file=tokens, **settings)
    return create_app(configured, redis=fake_redis(fake_server), executor=lambda *_: stub)


async def post_run(client: httpx.AsyncClient, network: Any) -> httpx.Response:
    return await client.post("/v1/runs", json={"prompt": "p", "options": {"network": network}})


async def test_full_is_refused_where_the_operator_forbids_it(
    fake_server: fakeredis.FakeServer,
) -> None:
    stub = StubExecutor()
    app = create_app(api_settings(), redis=fake_redis(fake_server), executor=lambda *_: stub)
    async with serving(app) as client:
        run = await post_run(client, "full")
        batch = await client.post(
            "/v1/batches",
            json={"items": [{"id": "a", "prompt": "p", "network": ["pypi.org:443"]}]},
        )
    assert run.status_code == 422
    [error] = run.json()["errors"]
    assert error["field"] == "options.network"
    assert error["message"] == 'network "full" is not allowed here (TOOLQ_NETWORK_ALLOWED=none)'
    assert batch.status_code == 422
    [error] = batch.json()["errors"]
    assert error["field"] == "items.0.network"
    assert "a network is not allowed here (TOOLQ_NETWORK_ALLOWED=none)" in error["message"]
    assert stub.runs == [] and stub.batches == []


async def test_a_permitted_list_reaches_the_run_as_written(
    fake_server: fakeredis.FakeServer,
) -> None:
    stub = StubExecutor()
    settings = api_settings(network_allowed="pypi.org:*,10.1.2.0/24:*")
    app = create_app(settings, redis=fake_redis(fake_server), executor=lambda *_: stub)
    async with serving(app) as client:
        allowed = await post_run(client, ["PyPI.org:443", "10.1.2.0/25:8080"])
        wider = await post_run(client, ["10.1.0.0/16:8080"])
        malformed = await post_run(client, ["pypi.org"])
    assert allowed.status_code == 202, allowed.text
    assert stub.runs[0][2].network == ["pypi.org:443", "10.1.2.0/25:8080"]
    assert wider.status_code == 422
    assert "10.1.0.0/16:8080 is not allowed here" in wider.json()["errors"][0]["message"]
    assert malformed.status_code == 422
    assert "has no port" in malformed.json()["errors"][0]["message"]
    assert len(stub.runs) == 1


async def test_a_tenant_gets_no_more_than_its_own_allowance(
    fake_server: fakeredis.FakeServer, tmp_path: Path
) -> None:
    stub = StubExecutor()
    app = tenants_app(
        fake_server,
        tmp_path,
        stub,
        network_allowed="list",
        tenant_network_allowed="alice=pypi.org:443",
    )
    async with serving(app, bearer(ALICE)) as alice:
        refused = await post_run(alice, ["10.1.2.3:80"])
        allowed = await post_run(alice, ["pypi.org:443"])
    async with serving(app, bearer(BOB)) as bob:
        other = await post_run(bob, ["10.1.2.3:80"])
    assert refused.status_code == 422
    assert refused.json()["errors"][0]["message"] == (
        "network destination 10.1.2.3:80 is not allowed here "
        "(TOOLQ_TENANT_NETWORK_ALLOWED for alice allows pypi.org:443)"
    )
    assert allowed.status_code == 202 and other.status_code == 202
