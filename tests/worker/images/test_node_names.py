"""Two sandbox workers on one host never share a node name, and so never share the queue a
pinned run's calls go through: ``toolq worker`` names each its own, and a worker started under
a name a live one holds stops at once."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.local.stack import worker_argv, worker_environment
from tests.conftest import Caller, RedisServer, fleet_settings, wait_for
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.contract.wire import WorkerInfo
from worker.images.owner import pinned_queue

pytestmark = pytest.mark.integration

TOOLQ = Path(sys.executable).parent / "toolq"
START_S = 60.0


class Workers:
    """Worker processes this test started, each in a process group of its own."""

    def __init__(self, settings: WorkerSettings, logs: Path) -> None:
        self.env = {**os.environ, **worker_environment(settings)}
        self.logs = logs
        self.started: list[subprocess.Popen[bytes]] = []

    def start(self, argv: list[str]) -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker-{len(self.started)}.log").open("ab")
        proc = subprocess.Popen(
            argv, env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        log.close()
        self.started.append(proc)
        return proc

    def log(self, proc: subprocess.Popen[bytes]) -> str:
        return (self.logs / f"worker-{self.started.index(proc)}.log").read_text(errors="replace")

    def stop(self) -> None:
        for proc in self.started:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
        for proc in self.started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)


@pytest.fixture
def settings(own_redis: RedisServer, tmp_path: Path) -> WorkerSettings:
    root = tmp_path / "workspaces"
    root.mkdir()
    root.chmod(0o755)
    return fleet_settings(own_redis.url, root)


@pytest.fixture
def workers(settings: WorkerSettings, tmp_path: Path) -> Iterator[Workers]:
    started = Workers(settings, tmp_path)
    yield started
    started.stop()


def sandbox_workers(settings: WorkerSettings) -> dict[str, WorkerInfo]:
    """The sandbox workers that announce themselves, by node name."""
    client = redis.Redis.from_url(settings.redis_url)
    try:
        found = {}
        for key in client.scan_iter(keys.worker_heartbeats("sandbox")):
            raw = client.get(key)
            if raw is not None:
                info = WorkerInfo.model_validate_json(raw)
                found[info.worker] = info
        return found
    finally:
        client.close()


def parent_of(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat[stat.rfind(")") + 2 :].split()[1])


async def test_two_sandbox_workers_on_one_host_each_get_their_own_name_and_queue(
    settings: WorkerSettings, workers: Workers
) -> None:
    first = workers.start([str(TOOLQ), "worker", "--pool", "sandbox", "--concurrency", "2"])
    second = workers.start([str(TOOLQ), "worker", "--pool", "sandbox", "--concurrency", "2"])
    wait_for(lambda: len(sandbox_workers(settings)) == 2, START_S, "both workers to announce")
    found = sandbox_workers(settings)
    assert {info.pid for info in found.values()} == {first.pid, second.pid}
    assert len({info.host for info in found.values()}) == 1  # one host, two names

    # Every call of a run sent to one worker's own queue runs there, never on the other.
    node, info = next(iter(found.items()))
    async with Dispatcher(settings) as dispatcher:
        caller = Caller(dispatcher, settings, f"pinned-{uuid.uuid4().hex[:8]}")
        answers = [
            await caller("run_bash", {"command": "echo $$"}, pool=pinned_queue(node))
            for _ in range(8)
        ]
    assert all(not answer.is_error for answer in answers), [a.output for a in answers]
    ran_in = {int(str(answer.worker).rsplit(":", 1)[1]) for answer in answers}
    assert {parent_of(pid) for pid in ran_in} == {info.pid}


def test_a_sandbox_worker_started_under_a_name_a_live_one_holds_exits_in_one_line(
    settings: WorkerSettings, workers: Workers
) -> None:
    holder = workers.start([str(TOOLQ), "worker", "--pool", "sandbox", "--concurrency", "1"])
    wait_for(lambda: len(sandbox_workers(settings)) == 1, START_S, "the first worker")
    (node,) = sandbox_workers(settings)
    twin = workers.start(worker_argv("sandbox", node=node, concurrency=1))
    code = twin.wait(timeout=START_S)
    assert code == 2
    assert f"another sandbox worker already runs as node {node!r} (pid {holder.pid}" in (
        workers.log(twin)
    )
    # The first serves on, under its name alone.
    assert holder.poll() is None
    assert {info.pid for info in sandbox_workers(settings).values()} == {holder.pid}
