"""A run's ``limits`` on the HTTP API: asking more than the fleet allows is a 422 naming what,
before anything of the run starts; the CLI refuses it the same way, with exit status 2."""

from __future__ import annotations

import httpx
from typer.testing import CliRunner

from api.cli import app


async def test_a_run_asking_more_memory_than_allowed_is_refused_with_422(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/runs",
        json={"prompt": "hi", "options": {"limits": {"memory_mb": 999_999, "pids": 8}}},
    )

    assert response.status_code == 422, response.text
    assert "options.limits" in response.text
    assert "memory_mb=999999 (at most 4096)" in response.text
    listed = await client.get("/v1/runs")
    assert listed.json().get("runs", []) == []


async def test_a_malformed_limit_is_refused_by_the_schema(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/runs", json={"prompt": "hi", "options": {"limits": {"memory": 64}}}
    )

    assert response.status_code == 422


def test_the_cli_refuses_a_run_over_the_maximum_in_one_line_with_status_2() -> None:
    result = CliRunner().invoke(app, ["run", "--limits", "pids=5000", "hello"])

    assert result.exit_code == 2
    assert "pids=5000 (at most 1024)" in result.output
    bad = CliRunner().invoke(app, ["run", "--limits", "pids", "hello"])
    assert bad.exit_code == 2 and "name=value" in bad.output
