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

from api.calls.dispatch import Dispatcher
from api.local.stack import free_port
from tests.conftest import RedisServer, fleet_settings, tool_spec

pytestmark = pytest.mark.integration

WRITE = tool_spec("write_file")
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
                task_id=f"call-{index}-{uuid.uuid4().hex}",
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
    sent = {request.task_id: request for request in requests}
    for message in queued:
        headers = message["headers"]
        assert headers["task"] == "toolq.execute_tool"
        assert message["properties"]["delivery_info"]["routing_key"] == "tools"
        [request_body], _, _ = json.loads(base64.b64decode(message["body"]))
        assert request_body == sent[headers["id"]].model_dump(mode="json")
        # Task events and Flower show argsrepr: the tool and run, never the file's contents.
        assert headers["argsrepr"] == "('write_file', run 'run-1')"
        assert SECRET not in json.dumps(headers)


async def test_an_unreachable_broker_answers_every_call_before_its_deadline(
    tmp_path: Path,
) -> None:
    nowhere = f"redis://127.0.0.1:{free_port()}/0"
    settings = fleet_settings(nowhere, tmp_path, hard_limit_grace_s=0.5, reply_margin_s=0.5)
    async with Dispatcher(settings) as dispatcher:
        requests = [
            dispatcher.build_request(
                WRITE, task_id=f"call-{index}", run_id="run-1", arguments={}, timeout_ms=2000
            )
            for index in range(50)
        ]
        results = await asyncio.gather(*(dispatcher.call(r, "tools") for r in requests))
        answered_at = time.time()

    # Tried again until the deadline came near, then said why: not a bare "no answer".
    assert {r.error_kind for r in results} == {"broker_unavailable"}
    assert all("could not be sent to the 'tools' queue" in r.output for r in results)
    assert sorted(r.task_id for r in results) == sorted(r.task_id for r in requests)
    assert answered_at < min(r.deadline for r in requests)


async def test_calls_sent_while_the_broker_is_down_go_out_when_it_is_back(
    tmp_path: Path,
) -> None:
    broker = RedisServer(tmp_path)
    broker.start()
    settings = fleet_settings(broker.url, tmp_path / "ws")
    try:
        async with Dispatcher(settings) as dispatcher:
            requests = [
                dispatcher.build_request(
                    WRITE, task_id=f"call-{index}", run_id="run-1", arguments={}
                )
                for index in range(20)
            ]
            broker.stop()
            waiting = [asyncio.create_task(dispatcher.call(r, "tools")) for r in requests]
            await asyncio.sleep(1.0)  # the outage itself
            broker.start()
            client = redis.Redis.from_url(broker.url)
            deadline = time.monotonic() + 10
            while client.llen("tools") < len(requests) and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            queued = [json.loads(raw)["headers"]["id"] for raw in client.lrange("tools", 0, -1)]
            client.close()
            answered_early = [task.result() for task in waiting if task.done()]
            for task in waiting:
                task.cancel()
            await asyncio.gather(*waiting, return_exceptions=True)
    finally:
        broker.stop()

    assert answered_early == []
    assert sorted(set(queued)) == sorted(r.task_id for r in requests)
