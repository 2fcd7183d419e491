"""Event streams against real processes: a `toolq serve` on real workers and a scripted model
that pauses longer than the Redis socket timeout, followed by hundreds of clients at once; and
the app under uvicorn in this process, followed through the API and the viewer's live page.

A run's model call waits at a gate (a tool whose path is the prompt) until every follower is in,
so that each one follows the pause after it live.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from openai import AsyncOpenAI

from api.http import sse
from api.http.app import create_app
from api.model.client import ChatModel, RetryPolicy
from api.scripted.server import ScriptedServer
from tests.api.http.conftest import TOKEN
from tests.api.http.serving import Replica, served_in_thread
from tests.conftest import WorkerFleet, orchestrator_settings

pytestmark = pytest.mark.integration

#: Seconds the model thinks between its turns in the test that 200 clients follow: three
#: keep-alive intervals (5 s), so each stream has one however late its timer started.
LONG_PAUSE_S = 15
#: A pause well past redis-py's socket timeout (5 s) and the keep-alive interval (5 s).
PAUSE_PAST_SOCKET_TIMEOUT_S = 12
#: Seconds every follower has to reach a milestone, on a loaded machine.
FOLLOWERS_BOUND_S = 60
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "ponder": [
        {"tool_calls": [{"name": "gate", "arguments": {"path": "{prompt}"}}]},
        {"content": "Thought it through.", "fault": {"kind": "stall", "seconds": LONG_PAUSE_S}},
    ],
    "ponder_briefly": [
        {"tool_calls": [{"name": "gate", "arguments": {"path": "{prompt}"}}]},
        {
            "content": "Thought it through.",
            "fault": {"kind": "stall", "seconds": PAUSE_PAST_SOCKET_TIMEOUT_S},
        },
    ],
    # Thinks until it is cancelled: every attempt stalls past the model client's timeout.
    "stuck": [{"content": "never", "fault": {"kind": "stall", "seconds": 600, "times": 20}}],
    "answer": [{"content": "A plain answer."}],
}

#: What a stream gave: its events, and its comments as their text.
Frame = dict[str, Any] | str


class Milestone:
    """Set once ``count`` followers have each reached it."""

    def __init__(self, count: int) -> None:
        self._left = count
        self.reached = asyncio.Event()

    def reach(self) -> None:
        self._left -= 1
        if self._left == 0:
            self.reached.set()


async def follow(
    client: httpx.AsyncClient, path: str, reached: Callable[[Frame], bool], milestone: Milestone
) -> list[Frame]:
    """Every frame of the stream at ``path`` up to ``done``; ``milestone`` is reached at the
    first frame for which ``reached`` is true."""
    frames: list[Frame] = []
    fields: dict[str, str] = {}
    counted = False
    async with client.stream("GET", path) as response:
        assert response.status_code == 200, (await response.aread()).decode()
        async for line in response.aiter_lines():
            frame: Frame | None = None
            if line.startswith(":"):
                frame = line
            elif line:
                name, _, value = line.partition(": ")
                fields[name] = value
            elif "data" in fields:
                frame = json.loads(fields["data"])
                fields = {}
            if frame is None:
                continue
            if not counted and reached(frame):
                counted = True
                milestone.reach()
            frames.append(frame)
            if isinstance(frame, dict) and frame["type"] == "done":
                return frames
    raise AssertionError(f"the stream at {path} ended before done: {frames}")


async def when_all_reached(
    milestone: Milestone, followers: list[asyncio.Task[list[Frame]]]
) -> None:
    """Wait until every follower has reached ``milestone``; fail at once if one stream ends."""
    waiting = asyncio.ensure_future(milestone.reached.wait())  # bound: asyncio.wait's below
    finished, _ = await asyncio.wait(
        [waiting, *followers], timeout=FOLLOWERS_BOUND_S, return_when=asyncio.FIRST_COMPLETED
    )
    if not finished:
        waiting.cancel()
        raise AssertionError(
            f"timed out after {FOLLOWERS_BOUND_S}s waiting for every follower's stream to reach"
            " the milestone"
        )
    if waiting not in finished:
        waiting.cancel()
        for follower in finished:
            follower.result()  # its failure, if it failed
        raise AssertionError("a stream ended before every follower was in")


def is_keep_alive(frame: Frame) -> bool:
    return frame == sse.KEEP_ALIVE.decode().strip()


def has_type(kind: str) -> Callable[[Frame], bool]:
    return lambda frame: isinstance(frame, dict) and frame["type"] == kind


def events_of(frames: list[Frame]) -> list[dict[str, Any]]:
    return [frame for frame in frames if isinstance(frame, dict)]


def keep_alives_during_pause(frames: list[Frame]) -> int:
    """Keep-alives between the gate's call finishing and the model's next words."""
    finished = next(n for n, f in enumerate(frames) if has_type("tool_call_finished")(f))
    answered = next(n for n, f in enumerate(frames) if has_type("text_delta")(f))
    return sum(1 for frame in frames[finished:answered] if is_keep_alive(frame))


def open_client(base_url: str, headers: dict[str, str] | None = None) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=base_url,
        headers=headers or {},
        limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        # A bound for a hung test, far past any keep-alive interval.
        timeout=httpx.Timeout(120),
    )


@pytest.mark.timeout(300)
async def test_two_hundred_followers_see_keep_alives_while_the_model_thinks_and_then_done(
    server: Replica, tmp_path: Path
) -> None:
    gate = tmp_path / "gate"
    run_id = server.create_run("ponder", str(gate))
    in_before_the_pause = Milestone(200)
    async with open_client(server.url, {"Authorization": f"Bearer {TOKEN}"}) as client:
        followers = [
            asyncio.create_task(
                follow(
                    client,
                    f"/v1/runs/{run_id}/events",
                    has_type("tool_call_started"),
                    in_before_the_pause,
                )
            )
            for _ in range(200)
        ]
        await when_all_reached(in_before_the_pause, followers)
        gate.touch()
        streams = await asyncio.gather(*followers)

    expected = events_of(streams[0])
    assert [e["type"] for e in expected if e["type"] != "text_delta"] == [
        "tool_call_started",
        "tool_call_finished",
        "final_answer",
        "done",
    ]
    gate_call = next(e for e in expected if e["type"] == "tool_call_finished")
    assert not gate_call["is_error"], gate_call  # the gate opened: the pause came after it
    assert expected[-1]["status"] == "succeeded"
    for frames in streams:
        assert events_of(frames) == expected
        assert keep_alives_during_pause(frames) >= 1


@pytest.mark.timeout(300)
async def test_a_thousand_followers_leave_new_streams_and_health_working(
    server: Replica,
) -> None:
    run_id = server.create_run("stuck")
    waiting = Milestone(1000)
    async with open_client(server.url, {"Authorization": f"Bearer {TOKEN}"}) as client:
        followers = [
            asyncio.create_task(follow(client, f"/v1/runs/{run_id}/events", is_keep_alive, waiting))
            for _ in range(1000)
        ]
        # Every one of them is in and waits for the model.
        await when_all_reached(waiting, followers)

        health = await client.get("/healthz")
        assert health.status_code == 200, health.text
        assert health.json()["redis"] is True
        another = server.create_run("answer")
        newcomer = await follow(
            client, f"/v1/runs/{another}/events", has_type("done"), Milestone(1)
        )
        assert events_of(newcomer)[-2]["text"] == "A plain answer."
        assert events_of(newcomer)[-1]["status"] == "succeeded"

        cancel = await client.post(f"/v1/runs/{run_id}/cancel")
        assert cancel.status_code in (200, 202), cancel.text
        streams = await asyncio.gather(*followers)

    for frames in streams:
        assert events_of(frames)[-1]["type"] == "done"
        assert events_of(frames)[-1]["status"] == "cancelled"


@pytest.mark.timeout(120)
async def test_a_pause_longer_than_the_redis_socket_timeout_sends_keep_alives_not_a_cut(
    fleet: WorkerFleet,
    model: ScriptedServer,
    tmp_path: Path,
) -> None:
    settings = orchestrator_settings(fleet.settings)
    openai = AsyncOpenAI(base_url=model.base_url, api_key="test", max_retries=0, timeout=60)
    # Redis as a replica reaches it by default (redis-py's own 5 s socket timeout), and the
    # keep-alive interval as it is (no shorter than that timeout).
    app = create_app(settings, model=ChatModel(openai, RetryPolicy(attempts=1)))
    gate = tmp_path / "gate"
    async with served_in_thread(app) as url, open_client(url) as client:
        body = {"prompt": str(gate), "options": {"model": "scripted:ponder_briefly"}}
        created = await client.post("/v1/runs", json=body)
        assert created.status_code == 202, created.text
        run_id = created.json()["id"]
        in_before_the_pause = Milestone(2)
        followers = [
            asyncio.create_task(
                follow(client, path, has_type("tool_call_started"), in_before_the_pause)
            )
            # The API's stream, and the viewer's live run page's.
            for path in (f"/v1/runs/{run_id}/events", f"/ui/live/runs/{run_id}")
        ]
        await when_all_reached(in_before_the_pause, followers)
        gate.touch()
        api_stream, viewer_stream = await asyncio.gather(*followers)

    for frames in (api_stream, viewer_stream):
        assert keep_alives_during_pause(frames) >= 1
        assert events_of(frames)[-1]["status"] == "succeeded"
    assert events_of(api_stream) == events_of(viewer_stream)
