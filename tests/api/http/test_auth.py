"""Who gets in and how much they may send: the bearer token, loopback without one, body size."""

from __future__ import annotations

from collections.abc import AsyncIterator

import fakeredis
import httpx
import pytest

from api.http.app import create_app
from api.http.server import is_loopback
from tests.api.http.conftest import (
    BODY_LIMIT,
    TOKEN,
    StubExecutor,
    api_settings,
    fake_redis,
    serving,
)

# --- Authentication ------------------------------------------------------------------------------


GUARDED = [
    ("GET", "/v1/tools"),
    ("POST", "/v1/runs"),
    ("GET", "/v1/runs/run-x"),
    ("GET", "/v1/runs/run-x/events"),
    ("POST", "/v1/runs/run-x/cancel"),
    ("POST", "/v1/batches"),
    ("GET", "/v1/batches/batch-x"),
    ("GET", "/metrics"),
    ("GET", "/openapi.json"),
]


@pytest.mark.parametrize(("method", "path"), GUARDED)
@pytest.mark.parametrize(
    "headers",
    [{}, {"Authorization": "Bearer not-the-token"}, {"Authorization": f"Basic {TOKEN}"}],
    ids=["missing", "wrong", "not-bearer"],
)
async def test_every_route_but_health_needs_the_token(
    client: httpx.AsyncClient, stub: StubExecutor, method: str, path: str, headers: dict[str, str]
) -> None:
    client.headers.pop("Authorization")
    body = {"prompt": "hi"} if method == "POST" else None
    response = await client.request(method, path, json=body, headers=headers)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "TOOLQ_API_TOKEN" in response.json()["detail"]
    assert stub.runs == []


async def test_the_right_token_is_let_in_and_health_needs_none(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v1/tools")).status_code == 200
    health = await client.get("/healthz", headers={"Authorization": ""})
    assert health.status_code == 200
    assert health.json()["redis"] is True


async def test_without_a_configured_token_the_api_is_open(
    fake_server: fakeredis.FakeServer,
) -> None:
    app = create_app(
        api_settings(api_token=None),
        redis=fake_redis(fake_server),
        executor=lambda *_: StubExecutor(),
    )
    async with serving(app, headers={}) as api:
        assert (await api.get("/v1/tools")).status_code == 200


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.8.0.1", True),
        ("localhost", True),
        ("::1", True),
        ("[::1]", True),
        ("0.0.0.0", False),
        ("10.0.0.1", False),
        ("api.internal", False),
    ],
)
def test_only_loopback_addresses_count_as_private(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


# --- Body size -----------------------------------------------------------------------------------


async def test_a_body_declared_too_large_is_refused_before_it_is_read(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    response = await client.post("/v1/runs", json={"prompt": "a" * BODY_LIMIT})
    assert response.status_code == 413
    assert "TOOLQ_API_MAX_BODY_BYTES" in response.json()["detail"]
    assert stub.runs == []


async def test_a_chunked_body_is_cut_off_once_it_passes_the_limit(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    sent = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal sent
        yield b'{"prompt": "'
        for _ in range(4 * BODY_LIMIT // 1024):
            sent += 1024
            yield b"a" * 1024
        yield b'"}'

    response = await client.post(
        "/v1/runs", content=chunks(), headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 413
    assert stub.runs == []


async def test_a_large_prompt_within_the_limit_is_accepted_whole(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    prompt = "word " * ((BODY_LIMIT - 200) // 5)
    response = await client.post("/v1/runs", json={"prompt": prompt})
    assert response.status_code == 202
    assert stub.runs[0][1] == prompt
    run = (await client.get(f"/v1/runs/{response.json()['id']}")).json()
    assert run["prompt"] == prompt
