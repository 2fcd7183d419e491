"""The API's document tells the truth: the tools it accepts, its error bodies, its statuses."""

from __future__ import annotations

import re
from typing import Any

import httpx

from api.batch.items import ItemLimits
from api.calls.fleet import Fleet
from api.http.openapi import with_fleet_tools
from tests.api.http.conftest import FLEET
from worker.contract.network import NetworkAllowance


async def test_the_document_names_the_tools_a_run_may_switch_on_and_off(
    client: httpx.AsyncClient,
) -> None:
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    options = schemas["AgentOptions"]["properties"]
    # run_bash is known, but no sandbox worker is alive in the test fleet.
    assert options["enable"]["items"]["enum"] == ["read_file"]
    assert options["disable"]["items"]["enum"] == ["read_file", "run_bash"]
    assert schemas["BatchItem"]["properties"]["enable"]["items"]["enum"] == ["read_file"]
    assert "a tool a live worker serves" in options["enable"]["description"]


def test_a_fleet_with_no_tools_accepts_no_tool_names() -> None:
    schema: dict[str, Any] = {
        "components": {"schemas": {"AgentOptions": {"properties": {"enable": {}}}}}
    }
    patched = with_fleet_tools(schema, Fleet(tools={}))
    assert patched["components"]["schemas"]["AgentOptions"]["properties"]["enable"]["maxItems"] == 0
    assert schema["components"]["schemas"]["AgentOptions"]["properties"]["enable"] == {}
    assert with_fleet_tools({}, FLEET) == {}


async def test_refusals_are_documented_with_the_body_they_have(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    problem = document["components"]["schemas"]["ValidationProblem"]
    assert problem["properties"]["detail"]["type"] == "string"
    assert "HTTPValidationError" not in document["components"]["schemas"]
    paths = document["paths"]
    for path, method in [
        ("/v1/runs", "post"),
        ("/v1/batches", "post"),
        ("/v1/runs/{run_id}", "get"),
        ("/v1/batches/{batch_id}", "get"),
    ]:
        answer = paths[path][method]["responses"]["422"]
        assert answer["content"]["application/json"]["schema"]["$ref"].endswith(
            "/ValidationProblem"
        )
    assert "409" in paths["/v1/batches"]["post"]["responses"]
    events = paths["/v1/runs/{run_id}/events"]["get"]
    assert "400" in events["responses"]
    header = next(p for p in events["parameters"] if p["in"] == "header")
    assert header["schema"]["pattern"] == r"^(\d{1,19}(-\d{1,19})?)?$"


async def test_a_body_that_is_not_utf8_is_invalid_json_not_a_bare_400(
    client: httpx.AsyncClient,
) -> None:
    response = await client.post(
        "/v1/runs", content=b"\xff{}", headers={"Content-Type": "application/json"}
    )
    assert response.status_code == 422
    assert response.json()["errors"][0]["field"] == "body"
    assert "not UTF-8 text (invalid start byte at byte 0)" in response.json()["detail"]


async def test_a_run_that_ended_answers_a_late_reader_at_once(client: httpx.AsyncClient) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "p"})).json()["id"]
    await client.post(f"/v1/runs/{run_id}/cancel")
    # An id past the end of its events: the stream ends at once with how the run ended.
    late = await client.get(
        f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "9999999999999-0"}, timeout=3
    )
    assert late.status_code == 200
    assert late.text.count("event: done") == 1 and '"status":"cancelled"' in late.text


async def test_the_document_offers_the_network_the_operator_permits(
    client: httpx.AsyncClient,
) -> None:
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    # TOOLQ_NETWORK_ALLOWED unset: "none" alone, so a request the schema allows is taken.
    for component in ("AgentOptions", "BatchItem"):
        assert schemas[component]["properties"]["network"]["anyOf"] == [
            {"type": "string", "enum": ["none"]}
        ]
    schema: dict[str, Any] = {
        "components": {"schemas": {"AgentOptions": {"properties": {"network": {}}}}}
    }
    mirror = ItemLimits(network=NetworkAllowance.parse("full", "TOOLQ_NETWORK_ALLOWED"))
    full = with_fleet_tools(schema, FLEET, mirror)["components"]["schemas"]["AgentOptions"]
    [modes, listed] = full["properties"]["network"]["anyOf"]
    assert modes["enum"] == ["none", "full"]
    assert re.match(listed["items"]["pattern"], "pypi.org:443")
    assert not re.match(listed["items"]["pattern"], "10.0.0.1:443")
    named = ItemLimits(network=NetworkAllowance.parse("pypi.org:443", "TOOLQ_NETWORK_ALLOWED"))
    only = with_fleet_tools(schema, FLEET, named)["components"]["schemas"]["AgentOptions"]
    assert only["properties"]["network"]["anyOf"][1]["items"]["enum"] == ["pypi.org:443"]


async def test_the_document_offers_the_limits_the_operator_permits(
    client: httpx.AsyncClient,
) -> None:
    """A run's limits stop where the server refuses them, so a request the schema allows is
    one the server takes (TOOLQ_LIMITS_MAX_* and TOOLQ_MAX_TIMEOUT_MS)."""
    schemas = (await client.get("/openapi.json")).json()["components"]["schemas"]
    fields = schemas["RunLimits"]["properties"]
    maximums = {
        name: [c["maximum"] for c in fields[name]["anyOf"] if "maximum" in c]
        for name in ("timeout_s", "memory_mb", "pids", "cpu")
    }
    assert maximums == {"timeout_s": [600.0], "memory_mb": [4096], "pids": [1024], "cpu": [4.0]}
    for component in ("AgentOptions", "BatchItem"):
        assert "RunLimits" in str(schemas[component]["properties"]["limits"])
