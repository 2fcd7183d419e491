"""The dispatcher's sending side against a real Redis: what goes on the queue, and what a
caller gets when nothing can be sent."""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from pathlib import Path

import pytest
import redis

from api.dispatch import Dispatcher
from api.local import free_port
from tests.conftest import RedisServer, fleet_settings
from worker.manifest import ToolSpec

pytestmark = pytest.mark.integration

WRITE = ToolSpec(
    name="write_file",
    description="",
    parameters={},
    pool="tools",
    enabled_by_default=True,
    idempotent=False,
    default_timeout_ms=5000,
)
SECRET = "the contents of a private file"


def queue_url(redis_server: RedisServer) -> str:
    """A database of the shared Redis that no worker consumes from."""
    return f"redis://127.0.0.1:{redis_server.port}/7"


async def test_queued_calls_carry_their_request_but_show_monitors_only_the_tool(
    redis_server: RedisServer, tmp_path: Path
) -> None:
    settings = fleet_settings(queue_url(redis_server), tmp_path)
    client = redis.Redis.from_url(settings.redis_url)
    client.flushdb()
    calls = 40
    async with Dispatcher(settings) as dispatcher:
        requests = [
            dispatcher.build_request(
                WRITE,
                tool_call_id=f"call-{index}-{uuid.uuid4().hex}",
                run_id="run-1",
                arguments={"path": "a.txt", "content": SECRET},
                timeout_ms=100,
            )
            for index in range(calls)
        ]
        waiting = [asyncio.create_task(dispatcher.call(r, "tools")) for r in requests]
        deadline = time.monotonic() + 10
        while client.llen("tools") < calls and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        queued = [json.loads(raw) for raw in client.lrange("tools", 0, -1)]
        for task in waiting:
            task.cancel()
        await asyncio.gather(*waiting, return_exceptions=True)
    client.close()

    assert len(queued) == calls
    sent = {request.tool_call_id: request for request in requests}
    for message in queued:
        headers = message["headers"]
        assert headers["task"] == "toolq.execute_tool"
        assert message["properties"]["delivery_info"]["routing_key"] == "tools"
        [request_body], _, _ = json.loads(base64.b64decode(message["body"]))
        assert request_body == sent[headers["id"]].model_dump(mode="json")
        # Task events and Flower show argsrepr: the tool and run, never the file's contents.
        assert headers["argsrepr"] == "('write_file', run 'run-1')"
        assert SECRET not in json.dumps(headers)


async def test_an_unreachable_broker_answers_every_call_promptly(tmp_path: Path) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    settings = fleet_settings(nowhere, tmp_path)
    async with Dispatcher(settings) as dispatcher:
        requests = [
            dispatcher.build_request(
                WRITE, tool_call_id=f"call-{index}", run_id="run-1", arguments={}
            )
            for index in range(50)
        ]
        started = time.monotonic()
        results = await asyncio.gather(*(dispatcher.call(r, "tools") for r in requests))
        elapsed = time.monotonic() - started

    assert {r.error_kind for r in results} == {"broker_unavailable"}
    assert all("could not be sent to the 'tools' queue" in r.output for r in results)
    assert sorted(r.tool_call_id for r in results) == sorted(r.tool_call_id for r in requests)
    # One round of retries for the outage, not one per call (each round takes about a second).
    assert elapsed < 15
