"""A sandbox worker killed with SIGKILL mid-call, as a crash does: the caller answers the call
``interrupted``, outcome unknown, once the worker stops announcing itself, not at the call's
deadline. A live worker's long call is never taken for a dead one's.

Each worker is a real ``celery worker`` process on a Redis of the test's own, started alone:
nothing starts it again.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
import redis

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, RedisServer, wait_for
from tests.reliability.conftest import alive, find_process
from tests.reliability.test_deaf_workers import LoneWorker, lone_worker, settings_for  # noqa: F401
from worker.contract.keys import keys
from worker.contract.wire import ToolCallRequest, ToolCallResult, start_mark, start_mark_node
from worker.plumbing.heartbeat import HEARTBEAT_TTL_S

pytestmark = pytest.mark.integration

#: The call's own limit, as a model's 60 s command.
CALL_MS = 60_000


def run_bash(dispatcher: Dispatcher, caller: Caller, command: str) -> ToolCallRequest:
    return dispatcher.build_request(
        caller.spec("run_bash"),
        task_id=f"call-{uuid.uuid4().hex}",
        run_id=caller.run_id,
        arguments={"command": command, "timeout": CALL_MS},
    )


def worker_node(worker: LoneWorker) -> str:
    """The node name the worker announces itself by."""
    client = redis.Redis.from_url(worker.settings.redis_url)
    try:
        for key in client.scan_iter(keys.worker_heartbeats(worker.pool)):
            return str(key.decode().rsplit(":", 1)[1])
    finally:
        client.close()
    raise AssertionError("the worker announces itself nowhere")


def announces(settings_url: str, pool: str, node: str) -> bool:
    client = redis.Redis.from_url(settings_url)
    try:
        return bool(client.exists(keys.worker_heartbeat(pool, node)))
    finally:
        client.close()


@pytest.fixture
def sandbox_worker(
    own_redis: RedisServer,
    lone_worker: Callable[..., LoneWorker],  # noqa: F811
    tmp_path: Path,
) -> LoneWorker:
    """A lone sandbox worker, serving, whose calls may run twice a model's command's limit."""
    settings = settings_for(own_redis, tmp_path, max_timeout_ms=2 * CALL_MS)
    return lone_worker(settings, "sandbox").wait_ready()


async def command_started(argv: tuple[str, ...]) -> list[int]:
    found: list[int] = []

    def started() -> bool:
        found[:] = find_process(argv)
        return bool(found)

    await asyncio.to_thread(wait_for, started, 60, f"{' '.join(argv)} to start")
    return found


@pytest.mark.timeout(300)
async def test_a_call_whose_worker_is_killed_is_answered_interrupted_before_its_deadline(
    sandbox_worker: LoneWorker,
) -> None:
    worker, settings = sandbox_worker, sandbox_worker.settings
    node = worker_node(worker)
    argv = ("sleep", "60.25")
    leftovers: list[int] = []
    try:
        async with Dispatcher(settings) as dispatcher:
            caller = Caller(dispatcher, settings, "run-dead-worker")
            request = run_bash(dispatcher, caller, "sleep 60.25")
            pending = asyncio.ensure_future(dispatcher.call(request, "sandbox"))
            leftovers = await command_started(argv)
            os.killpg(worker.pid, signal.SIGKILL)
            await asyncio.to_thread(worker.process.wait, 30)
            result: ToolCallResult = await pending
            # The answer came when the worker had stopped announcing itself, never before.
            assert not announces(settings.redis_url, "sandbox", node)
    finally:
        for pid in leftovers:
            if alive(pid):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
    assert result.error_kind == "interrupted", result.output
    assert "outcome is unknown" in result.output
    # Only the watch of silent workers words it so: the deadline's own timer would have
    # answered "no answer came in N s". So the answer came before that timer fired.
    assert f"worker {node}" in result.output and "stopped announcing itself" in result.output
    assert "no answer came in" not in result.output


@pytest.mark.timeout(300)
async def test_a_live_workers_long_call_is_answered_by_it(
    sandbox_worker: LoneWorker,
) -> None:
    worker, settings = sandbox_worker, sandbox_worker.settings
    node = worker_node(worker)
    async with Dispatcher(settings) as dispatcher:
        caller = Caller(dispatcher, settings, "run-live-worker")
        # Longer than a lapsed heartbeat and the patience after it: a silent worker's call
        # would be answered by then.
        seconds = f"{HEARTBEAT_TTL_S * 2}.5"
        request = run_bash(dispatcher, caller, f"sleep {seconds}; echo done")
        result = await dispatcher.call(request, "sandbox")
    assert not result.is_error, result.output
    assert "done" in result.output
    assert result.worker is not None and announces(settings.redis_url, "sandbox", node)


def test_a_start_marker_names_the_worker_a_process_is_part_of() -> None:
    assert start_mark_node(start_mark(2, "host:41", "sandbox-ab12@host")) == "sandbox-ab12@host"
    # A caller's mark, and one written before marks named their worker, name none.
    assert start_mark_node(start_mark(0, "caller:xyz")) is None
    assert start_mark_node("1 host:41") is None
    assert start_mark_node("host:41") is None
