"""The app as a whole: its routers, its schema, and its error answers across them."""

from __future__ import annotations

import fakeredis
import httpx

from api.calls.fleet import Fleet
from api.http.app import create_app
from tests.api.http.conftest import StubExecutor, api_settings, fake_redis, serving


async def test_openapi_schema_lists_every_route_and_the_bearer_scheme(
    client: httpx.AsyncClient,
) -> None:
    response = await client.get("/openapi.json")
    assert response.status_code == 200
    schema = response.json()
    assert set(schema["paths"]) == {
        "/v1/runs",
        "/v1/runs/{run_id}",
        "/v1/runs/{run_id}/events",
        "/v1/runs/{run_id}/cancel",
        "/v1/batches",
        "/v1/batches/{batch_id}",
        "/v1/tools",
        "/metrics",
        "/healthz",
    }
    assert schema["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    assert "security" in schema["paths"]["/v1/runs"]["post"]
    assert "security" not in schema["paths"]["/healthz"]["get"]
    assert "RunRequest" in schema["components"]["schemas"]


async def test_malformed_json_is_refused_with_a_clear_message(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/runs", content=b'{"prompt": "hi",', headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert "not valid JSON" in response.json()["detail"]


async def test_an_unreachable_store_is_a_clear_503(stub: StubExecutor) -> None:
    down = fakeredis.FakeServer()
    app = create_app(api_settings(), redis=fake_redis(down), executor=lambda *_: stub)
    async with serving(app) as api:
        down.connected = False
        created = await api.post("/v1/runs", json={"prompt": "p"})
        health = await api.get("/healthz")
        down.connected = True
    assert created.status_code == 503
    assert "Redis" in created.json()["detail"]
    assert health.status_code == 503
    assert health.json()["redis"] is False


async def test_unknown_runs_and_batches_are_404(client: httpx.AsyncClient) -> None:
    for path in ("/v1/runs/run-nope", "/v1/runs/run-nope/events", "/v1/batches/batch-nope"):
        response = await client.get(path)
        assert response.status_code == 404
        assert "nope" in response.json()["detail"]
    assert (await client.post("/v1/runs/run-nope/cancel")).status_code == 404


async def test_no_workers_means_503_not_a_run_that_can_only_fail(
    fake_server: fakeredis.FakeServer,
) -> None:
    idle = StubExecutor(Fleet(tools={}))
    app = create_app(api_settings(), redis=fake_redis(fake_server), executor=lambda *_: idle)
    async with serving(app) as api:
        response = await api.post("/v1/runs", json={"prompt": "hi"})
        batch = await api.post("/v1/batches", json={"items": [{"id": "a", "prompt": "hi"}]})
    assert response.status_code == 503
    assert "worker" in response.json()["detail"]
    assert batch.status_code == 503
    assert idle.runs == [] and idle.batches == []
