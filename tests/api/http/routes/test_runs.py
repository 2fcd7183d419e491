"""``/v1/runs`` on a stub executor: what is accepted and refused, the state and the events.

The stub executes nothing: the tests write a run's progress into the store themselves.
"""

from __future__ import annotations

import asyncio
from typing import Any

import fakeredis
import httpx
import pytest
from fastapi import FastAPI

from api.http.app import create_app
from api.state.run_end import RunEnd
from api.state.store import ApiStore
from tests.api.http.conftest import StubExecutor, api_settings, fake_redis, serving, sse_events

# --- Validation ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({}, "prompt", "Field required"),
        ({"prompt": ""}, "prompt", "at least 1 character"),
        ({"prompt": "hi", "options": {"max_turns": 0}}, "options.max_turns", "greater than 0"),
        ({"prompt": "hi", "options": {"colour": "red"}}, "options.colour", "Extra inputs"),
        ({"prompt": "hi", "options": {"run_id": "../etc"}}, "options.run_id", "pattern"),
        ({"prompt": 7}, "prompt", "valid string"),
        ({"prompt": "hi", "stream": True}, "stream", "Extra inputs"),
        ({"prompt": "hi", "options": {"enable": ["nope"]}}, "options.enable.0", "'nope'"),
        ({"prompt": "hi", "options": {"disable": ["nope"]}}, "options.disable.0", "'nope'"),
        ({"prompt": "hi", "options": {"enable": ["run_bash"]}}, "options.enable.0", "'sandbox'"),
        (
            {"prompt": "hi", "options": {"image": "Not An Image"}},
            "options.image",
            "image 'Not An Image': not an image reference",
        ),
    ],
)
async def test_an_invalid_run_is_refused_naming_the_field_and_the_reason(
    client: httpx.AsyncClient,
    stub: StubExecutor,
    body: dict[str, Any],
    field: str,
    reason: str,
) -> None:
    response = await client.post("/v1/runs", json=body)
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert [e["field"] for e in errors] == [field]
    assert reason in errors[0]["message"]
    assert f"{field}: " in response.json()["detail"]
    assert stub.runs == []


# --- State and events ----------------------------------------------------------------------------


async def test_a_run_is_accepted_queued_and_readable(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    response = await client.post("/v1/runs", json={"prompt": "hello", "options": {"max_turns": 3}})
    assert response.status_code == 202
    run_id = response.json()["id"]
    assert response.json()["status"] == "queued"
    assert response.headers["location"] == f"/v1/runs/{run_id}"
    assert stub.runs[0][0] == run_id
    assert stub.runs[0][2].run_id == run_id  # the workspace is named after the run
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "queued"
    assert run["options"]["max_turns"] == 3
    assert run["options"]["run_id"] == run_id
    assert run["transcript"] is None


async def test_options_left_out_take_the_servers_settings(
    fake_server: fakeredis.FakeServer, stub: StubExecutor
) -> None:
    app = create_app(
        api_settings(max_turns=7), redis=fake_redis(fake_server), executor=lambda *_: stub
    )
    async with serving(app) as api:
        await api.post("/v1/runs", json={"prompt": "p"})
        await api.post("/v1/runs", json={"prompt": "p", "options": {"max_turns": 2}})
    assert [options.max_turns for _, _, options in stub.runs] == [7, 2]


async def test_a_workspace_named_by_the_client_is_kept(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    response = await client.post("/v1/runs", json={"prompt": "p", "options": {"run_id": "ws-1"}})
    assert response.status_code == 202
    assert response.json()["id"] != "ws-1"
    assert stub.runs[0][2].run_id == "ws-1"


async def test_events_replay_then_follow_live_until_done(
    app: FastAPI,
    client: httpx.AsyncClient,
    fake_server: fakeredis.FakeServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "p"})).json()["id"]
    store = ApiStore(fake_redis(fake_server), retention_s=60)
    assert await store.mark_running(run_id)
    await store.add_event(run_id, {"type": "text_delta", "text": "Hel"})

    # Know when the stream has replayed what there was and waits for more.
    served: ApiStore = app.state.services.store
    replayed = asyncio.Event()
    read_events = served.read_events

    async def watched_read(
        run: str, after: str, *, block_ms: int, count: int = 500
    ) -> list[tuple[str, dict[str, Any]]]:
        if after != "0":
            replayed.set()
        return await read_events(run, after, block_ms=block_ms, count=count)

    monkeypatch.setattr(served, "read_events", watched_read)
    reader = asyncio.create_task(client.get(f"/v1/runs/{run_id}/events"))
    await asyncio.wait_for(replayed.wait(), 10)
    await store.add_event(run_id, {"type": "text_delta", "text": "lo"})
    await store.add_event(
        run_id, {"type": "final_answer", "text": "Hello", "stop_reason": "answered"}
    )
    ended = RunEnd(status="succeeded", answer="Hello", stop_reason="answered")
    assert await store.finish_run(run_id, ended)
    response = await asyncio.wait_for(reader, 10)

    assert response.headers["content-type"].startswith("text/event-stream")
    events = sse_events(response.text)
    assert [e["type"] for e in events] == ["text_delta", "text_delta", "final_answer", "done"]
    assert events[-1]["status"] == "succeeded"
    run = (await client.get(f"/v1/runs/{run_id}")).json()
    assert run["status"] == "succeeded" and run["answer"] == "Hello"

    # A reconnecting client resumes after the last event it saw.
    resumed = await client.get(
        f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": events[1]["_id"]}
    )
    assert [e["type"] for e in sse_events(resumed.text)] == ["final_answer", "done"]
    bad = await client.get(f"/v1/runs/{run_id}/events", headers={"Last-Event-ID": "x; DROP"})
    assert bad.status_code == 400


async def test_cancelling_a_run_not_started_ends_it_and_a_second_cancel_is_409(
    client: httpx.AsyncClient,
) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "p"})).json()["id"]
    first = await client.post(f"/v1/runs/{run_id}/cancel")
    assert first.status_code == 200
    assert first.json() == {"id": run_id, "status": "cancelled"}
    second = await client.post(f"/v1/runs/{run_id}/cancel")
    assert second.status_code == 409
    assert "cancelled" in second.json()["detail"]
    events = sse_events((await client.get(f"/v1/runs/{run_id}/events")).text)
    assert events[-1]["type"] == "done" and events[-1]["status"] == "cancelled"
