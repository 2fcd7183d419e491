"""Flower, started as the docs say (docs/how-to/operate.md), on a fleet running a batch whose
tool calls fail: it shows calls waiting in the queue, and each finished call as a success or a
failure with its outcome in a few words, never its arguments or output."""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import pytest

from api.calls.dispatch import Dispatcher
from api.local.stack import LocalStack, free_port, worker_environment
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from tests.conftest import REPO, RedisServer, fleet_settings, tool_spec, wait_for
from tests.e2e.commands import TOOLQ, clean_env
from tests.results_file import finished_records
from worker.contract.settings import WorkerSettings

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

#: Where the docs tell an operator to find Flower: its command is run as written there.
OPERATE_DOC = REPO / "docs" / "how-to" / "operate.md"
DOCS_PORT = "--port=5555"
#: Each conversation's one turn: a call that takes a while (so that others queue behind it on
#: a worker of one process), one with bad arguments and one the tool fails.
SLOW_S = 0.8
CALLS = [
    {"name": "slow_read", "arguments": {"seconds": SLOW_S, "marker": "m"}},
    {"name": "read_file", "arguments": {}},
    {"name": "read_file", "arguments": {"path": "no-such-file.txt"}},
]
CONVERSATIONS = 3
FINAL = {"SUCCESS", "FAILURE"}


def docs_flower_argv(port: int) -> list[str]:
    """The docs' Flower command, as written, on ``port``."""
    lines = [
        line.strip()
        for line in OPERATE_DOC.read_text().splitlines()
        if line.strip().startswith("celery -A worker.app flower")
    ]
    assert len(lines) == 1, lines
    words = shlex.split(lines[0], comments=True)
    assert DOCS_PORT in words
    celery = str(Path(sys.executable).parent / "celery")
    return [celery, *[f"--port={port}" if w == DOCS_PORT else w for w in words[1:]]]


@pytest.fixture(scope="module")
def monitored(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerSettings, int]]:
    """A tools worker of one process on a Redis of its own, and Flower watching it."""
    workdir = tmp_path_factory.mktemp("flower")
    redis_server = RedisServer(workdir)
    redis_server.start()
    root = workdir / "workspaces"
    root.mkdir(mode=0o755)
    settings = fleet_settings(redis_server.url, root)
    stack = LocalStack(settings, concurrency=1, pools=("tools",))
    port = free_port()
    flower = None
    try:
        stack.start_workers(settings)
        env = clean_env() | {
            "TOOLQ_BROKER_URL": redis_server.url,
            "FLOWER_UNAUTHENTICATED_API": "true",
        }
        log = (workdir / "flower.log").open("wb")
        flower = subprocess.Popen(
            docs_flower_argv(port), env=env, cwd=workdir, stdout=log, stderr=subprocess.STDOUT
        )
        yield stack.settings, port
    finally:
        if flower is not None:
            flower.terminate()
            flower.wait(timeout=10)
        stack.stop()
        redis_server.stop()


def flower_tasks(port: int) -> dict[str, dict[str, Any]]:
    """Flower's view of every task it has heard of ({} while it does not answer yet)."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/api/tasks", timeout=5)
    except httpx.TransportError:
        return {}
    response.raise_for_status()
    tasks: dict[str, dict[str, Any]] = response.json()
    return tasks


def send_noop(settings: WorkerSettings) -> str:
    async def call() -> str:
        async with Dispatcher(settings) as dispatcher:
            request = dispatcher.build_request(
                tool_spec("noop"), task_id=f"warm-{uuid.uuid4().hex}", run_id="warm", arguments={}
            )
            await dispatcher.call(request, "tools")
            return request.task_id

    return asyncio.run(call())


def wait_until_flower_hears_the_fleet(settings: WorkerSettings, port: int) -> None:
    """Flower takes a moment to subscribe to events: calls until it has seen one whole."""

    def seen(task_id: str) -> bool:
        return flower_tasks(port).get(task_id, {}).get("state") == "SUCCESS"

    for _ in range(20):
        task_id = send_noop(settings)
        try:
            wait_for(partial(seen, task_id), timeout=3, what="Flower to see a call")
            return
        except AssertionError:
            continue
    pytest.fail("Flower never saw a call")


def test_flower_sees_queued_calls_and_each_outcome(
    monitored: tuple[WorkerSettings, int], tmp_path: Path
) -> None:
    settings, port = monitored
    wait_until_flower_hears_the_fleet(settings, port)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"id": "c{n}", "prompt": "go"}}\n' for n in range(CONVERSATIONS)))
    output = tmp_path / "out.jsonl"
    script = Script.from_steps([{"tool_calls": CALLS}, {"content": "done"}])

    with ScriptedServer(script) as model:
        env = clean_env() | worker_environment(settings)
        env |= {"OPENAI_BASE_URL": model.base_url, "OPENAI_API_KEY": "test"}
        argv = [TOOLQ, "batch", str(source), "-o", str(output), "--model", "scripted"]
        batch = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            # The worker runs one call at a time: the others wait in the queue, and show.
            wait_for(
                lambda: any(queued(task) for task in flower_tasks(port).values()),
                timeout=30,
                what="Flower to show a call waiting in the queue",
            )
            _, stderr = batch.communicate(timeout=60)
        finally:
            if batch.poll() is None:
                batch.kill()
                batch.wait(timeout=30)
    assert batch.returncode == 0, stderr
    runs = {record["run_id"] for record in finished_records(output)}
    assert len(runs) == CONVERSATIONS

    def calls_of_the_batch() -> list[dict[str, Any]]:
        return [task for task in flower_tasks(port).values() if run_of(task) in runs]

    wait_for(
        lambda: (
            [t["state"] for t in calls_of_the_batch() if t["state"] in FINAL]
            == [t["state"] for t in calls_of_the_batch()]
            and len(calls_of_the_batch()) == len(CALLS) * CONVERSATIONS
        ),
        timeout=20,
        what="Flower to see every call of the batch finish",
    )
    calls = calls_of_the_batch()
    for run in runs:
        outcomes = sorted(outcome(task) for task in calls if run_of(task) == run)
        assert [state for state, _ in outcomes] == ["FAILURE", "FAILURE", "SUCCESS"], outcomes
        failed, tool_failed, ok = (shown for _, shown in outcomes)
        assert re.fullmatch(r"ToolCallFailed\('error invalid_arguments after \d+\.\d ms'\)", failed)
        assert re.fullmatch(r"ToolCallFailed\('error tool_error after \d+\.\d ms'\)", tool_failed)
        assert re.fullmatch(r"'ok \d+ ms'", ok), ok
    # Each call was seen sent before it was taken.
    assert all(task["sent"] and task["received"] for task in calls)
    # What a call was asked and answered stays out of the monitors.
    shown = json.dumps(calls)
    for private in ("no-such-file.txt", "Field required", "slept", '"marker"'):
        assert private not in shown


def queued(task: dict[str, Any]) -> bool:
    """Sent and not yet taken by a worker."""
    return task["state"] == "PENDING" and bool(task["sent"]) and not task["received"]


def run_of(task: dict[str, Any]) -> str | None:
    """The run a call belongs to, from its argsrepr: ``('read_file', run 'b-...')``."""
    found = re.search(r"run '([^']+)'", task.get("args") or "")
    return found.group(1) if found else None


def outcome(task: dict[str, Any]) -> tuple[str, str]:
    """(state, what Flower shows of the outcome), sorted so that failures come first."""
    return task["state"], task["exception"] if task["state"] == "FAILURE" else task["result"]
