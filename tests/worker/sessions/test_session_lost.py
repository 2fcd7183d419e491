"""A session does not outlive the worker that holds it: once that worker dies (SIGKILL, as a
crash), its shell and all it started are gone, and the run's next call, taken by a worker
started in its place, answers "session lost": never a silent new shell. ``restart`` then starts
one, asked."""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, RedisServer, wait_for
from tests.reliability.test_deaf_workers import LoneWorker, lone_worker, settings_for  # noqa: F401
from tests.worker.sessions.helpers import (
    alive,
    holder_pids,
    processes_with,
    session,
    token,
    wait_for_sleep,
)

pytestmark = pytest.mark.integration


async def test_a_session_outliving_its_worker_answers_session_lost(
    own_redis: RedisServer,
    lone_worker: Callable[..., LoneWorker],  # noqa: F811
    tmp_path: Path,
) -> None:
    settings = settings_for(own_redis, tmp_path)
    first = lone_worker(settings, "sandbox").wait_ready()
    run_id = f"run-{uuid.uuid4().hex[:12]}"
    mark = token()
    async with Dispatcher(settings) as dispatcher:
        call = Caller(dispatcher, settings, run_id)
        await session(call, "type_submit", f"export KEPT=1; sleep {mark} &")
        holders = holder_pids(settings, run_id)
        assert holders
        wait_for_sleep(mark)

        os.kill(first.pid, signal.SIGKILL)
        first.wait_exit()
        wait_for(lambda: not any(alive(pid) for pid in holders), 15, "the holder to end")
        wait_for(lambda: not processes_with(f"sleep {mark}"), 15, "the shell's job to end")
        lone_worker(settings, "sandbox").wait_ready()
        call = Caller(dispatcher, settings, run_id)

        lost = await call("bash_session", {"action": "type_submit", "input": "echo $KEPT"})

        assert lost.is_error and lost.error_kind == "session_lost", lost.output
        assert "session lost" in lost.output and "restart" in lost.output
        again = await call("bash_session", {"action": "read"})
        assert again.error_kind == "session_lost"  # until the model asks for a new shell
        assert (await session(call, "restart"))["running"] is False
        fresh = await session(call, "type_submit", "echo ${KEPT:-unset}")
        assert fresh["output"] == "unset\n"
