"""The service's own routes: the fleet's tools as the API lists them."""

from __future__ import annotations

import httpx


async def test_tools_lists_the_fleet_with_live_workers(client: httpx.AsyncClient) -> None:
    tools = {t["name"]: t for t in (await client.get("/v1/tools")).json()}
    assert tools["read_file"]["live_workers"] == 1
    assert tools["read_file"]["enabled_by_default"] is True
    assert tools["run_bash"] == {
        "name": "run_bash",
        "pool": "sandbox",
        "description": "run_bash for tests",
        "parameters": {"type": "object", "properties": {}},
        "enabled_by_default": False,
        "idempotent": True,
        "live_workers": 0,
    }
