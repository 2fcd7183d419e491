"""Shared fixtures: a private Redis server, real worker fleets on it, a caller of their tools,
a scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import read_manifest
from api.local.stack import (
    LocalStack,
    free_port,
    redis_server_argv,
    worker_argv,
    worker_environment,
)
from api.settings import OrchestratorSettings
from tests.parallel import HostAsFound, group_shared_fixtures
from worker.contract.keys import keys
from worker.contract.settings import FleetSettings, WorkerSettings
from worker.contract.wire import AGENTS_QUEUE, Pool, ToolCallResult, ToolSpec

if TYPE_CHECKING:
    from api.scripted.server import ScriptedServer

REPO = Path(__file__).resolve().parents[1]
#: get_current_weather comes without being named: toolq's own entry point brings it.
TEST_PLUGINS = ["tests.plugins.probe_tools"]


def wait_for(condition: Callable[[], bool], timeout: float = 10.0, what: str = "condition") -> None:
    """Poll ``condition`` until true; fail the test with ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


async def until(condition: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    """``wait_for`` in a coroutine: the event loop runs on between the polls of ``condition``."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        await asyncio.sleep(0.02)


@dataclass
class Clock:
    """A clock that stands still until the test moves ``now``."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


def start_logged(
    argv: list[str], env: Mapping[str, str], log_path: Path
) -> subprocess.Popen[bytes]:
    """``argv`` started as the leader of a process group of its own, its output in ``log_path``."""
    with log_path.open("wb") as log:
        return subprocess.Popen(
            argv,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def wait_for_file(
    path: Path, process: subprocess.Popen[bytes], log: Path, what: str, timeout: float = 120
) -> None:
    """Until ``process`` has written ``path``, waiting for ``what``; fails with the process's
    ``log`` if it exits first."""

    def written() -> bool:
        if process.poll() is not None:
            raise AssertionError(f"exited without writing {path.name}:\n{log.read_text()}")
        return path.exists()

    wait_for(written, timeout, what)


def tool_spec(name: str, pool: Pool = "tools", **fields: Any) -> ToolSpec:
    """A tool as a fleet would publish it: off-fleet, or crafted for a test."""
    values: dict[str, Any] = {
        "description": "",
        "parameters": {},
        "enabled_by_default": True,
        "idempotent": False,
        "default_timeout_ms": 5000,
    }
    return ToolSpec(name=name, pool=pool, **(values | fields))


@contextlib.contextmanager
def scripted_server(
    directory: Path, scripts: Mapping[str, list[dict[str, Any]]], default: str = "default"
) -> Iterator[ScriptedServer]:
    """A scripted model that answers ``scripted:<name>`` with ``scripts[name]``'s steps (written
    to ``directory``) and any other model name with ``default``."""
    # Imported here: FastAPI and uvicorn are no concern of the worker tests.
    from api.scripted.script import Script
    from api.scripted.server import ScriptedServer

    for name, steps in scripts.items():
        (directory / f"{name}.json").write_text(json.dumps({"steps": steps}))
    with ScriptedServer(Script.from_steps([{"content": default}]), scripts_dir=directory) as server:
        yield server


class RedisServer:
    """A redis-server of the test's own on a free port; can be stopped and started again."""

    def __init__(
        self,
        workdir: Path,
        password: str | None = None,
        *,
        appendonly: bool = False,
        binary: str | None = None,
    ) -> None:
        self.port = free_port()
        #: The redis-server to run: toolq's local stack's choice unless given.
        self.binary = binary
        self.password = password
        #: Keep an append-only file, as deployed: what was written survives a restart.
        self.appendonly = appendonly
        auth = f":{password}@" if password else ""
        self.url = f"redis://{auth}127.0.0.1:{self.port}/0"
        self._dir = workdir
        self._proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        persist = ["--appendonly", "yes"] if self.appendonly else []
        argv = redis_server_argv(self.port, self._dir, self.password)
        if self.binary is not None:
            argv[0] = self.binary
        self._proc = subprocess.Popen(
            [*argv, *persist],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis.from_url(self.url)
        wait_for(lambda: _pings(client), what="redis-server to answer")
        client.close()

    def stop(self, *, graceful: bool = False) -> None:
        """Kill the server, or with ``graceful`` shut it down as a restart does (it writes out
        its append-only file first)."""
        if self._proc is not None:
            if graceful:
                self._proc.terminate()
            else:
                self._proc.kill()
            self._proc.wait(timeout=60)
            self._proc = None


def _pings(client: redis.Redis) -> bool:
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    server.start()
    yield server
    server.stop()


@pytest.fixture
def own_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A Redis of the test's own, for what would trouble any test sharing it: a store out of
    memory, a restart, workers announcing themselves that no other fleet should see."""
    server = RedisServer(tmp_path)
    server.start()
    yield server
    server.stop()


@contextlib.contextmanager
def task_events_channel(redis_url: str) -> Iterator[redis.client.PubSub]:
    """Every task event message published on Celery's events exchange, as the broker carries
    it."""
    client = redis.Redis.from_url(redis_url)
    listening = client.pubsub()  # type: ignore[no-untyped-call]
    listening.psubscribe("/0.celeryev/task.*")
    listening.get_message(timeout=5)  # the subscription's confirmation
    try:
        yield listening
    finally:
        listening.close()
        client.close()


def fleet_settings(broker_url: str, workspace_root: Path, **overrides: object) -> WorkerSettings:
    values: dict[str, object] = {
        "broker_url": broker_url,
        "workspace_root": workspace_root,
        "plugins": TEST_PLUGINS,
        "default_timeout_ms": 10_000,
        "max_timeout_ms": 20_000,
        "hard_limit_grace_s": 1.0,
        "reply_margin_s": 2.0,
    }
    values.update(overrides)
    return WorkerSettings(**values)  # type: ignore[arg-type]


def unconsumed_settings(
    redis_server: RedisServer, workspace_root: Path, **overrides: object
) -> WorkerSettings:
    """Settings on a database of the shared Redis that no worker consumes from, emptied: what is
    sent there stays queued, for tests of the orchestrator's side alone."""
    url = f"redis://127.0.0.1:{redis_server.port}/10"
    client = redis.Redis.from_url(url)
    client.flushdb()
    client.close()
    return fleet_settings(url, workspace_root, **overrides)


def orchestrator_settings(fleet: FleetSettings, **overrides: object) -> OrchestratorSettings:
    """An orchestrator's settings for the fleet that ``fleet`` describes."""
    values = fleet.model_dump(include=set(FleetSettings.model_fields)) | overrides
    return OrchestratorSettings(**values)


class WorkerFleet:
    """Real ``celery -A worker.app worker`` processes of both pools on a given broker."""

    def __init__(self, settings: WorkerSettings, concurrency: int = 2) -> None:
        self.settings = settings
        self._stack = LocalStack(settings, concurrency=concurrency)

    def start(self) -> WorkerFleet:
        self._stack.start_workers(self.settings)
        return self

    def stop(self) -> None:
        self._stack.stop()

    def worker_pids(self, pool: str) -> list[int]:
        return self._stack.pids(f"worker-{pool}")

    def log(self, pool: str, lines: int = 200) -> str:
        return self._stack.log_tail(f"worker-{pool}", lines)


@pytest.fixture(scope="session")
def fleet(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerFleet]:
    """One fleet for the whole session: both pools, the test plugins, short deadlines."""
    root = tmp_path_factory.mktemp("workspaces")
    os.chmod(root, 0o755)
    workers = WorkerFleet(fleet_settings(redis_server.url, root)).start()
    yield workers
    workers.stop()


class AgentsWorker:
    """A real agents worker (``celery -A api.agents.app worker -Q agents``) on a fleet's broker,
    whose conversations ask the model at ``model_url``."""

    def __init__(
        self, settings: WorkerSettings, model_url: str, log_dir: Path, *, concurrency: int = 20
    ) -> None:
        self.settings = settings
        self.node = f"agents-{uuid.uuid4().hex[:6]}"
        self.log_path = log_dir / f"{self.node}.log"
        env = {
            **os.environ,
            **worker_environment(settings),
            "OPENAI_BASE_URL": model_url,
            "OPENAI_API_KEY": "test",
            "TOOLQ_AGENT_CONCURRENCY": str(concurrency),
        }
        argv = worker_argv(
            AGENTS_QUEUE,
            node=f"{self.node}@%h",
            extra=("--without-gossip", "--without-mingle"),
        )
        self.process = start_logged(argv, env, self.log_path)

    @property
    def process_name(self) -> str:
        """How output lines name this worker: ``host:pid``."""
        return f"{socket.gethostname()}:{self.process.pid}"

    def wait_ready(self) -> AgentsWorker:
        """Until its heartbeat names its process: one left by an earlier worker is no proof."""
        client = redis.Redis.from_url(self.settings.redis_url)
        key = keys.worker_heartbeat(AGENTS_QUEUE, f"{self.node}@{socket.gethostname()}")

        def announced() -> bool:
            if self.process.poll() is not None:
                raise AssertionError(f"{self.node} exited:\n{self.log_tail()}")
            info = client.get(key)
            return bool(info) and json.loads(info or "{}").get("pid") == self.process.pid

        try:
            wait_for(announced, 60, f"{self.node} to announce itself")
        finally:
            client.close()
        return self

    def kill(self) -> None:
        """SIGKILL, to the whole process group: the worker dies mid-conversation."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def log_tail(self, lines: int = 60) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@pytest.fixture
def agents_workers(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Callable[..., AgentsWorker]]:
    """Start agents workers (``start(settings, model_url)``): each is stopped after the test."""
    started: list[AgentsWorker] = []
    log_dir = tmp_path_factory.mktemp("agents")

    def start(settings: WorkerSettings, model_url: str, *, concurrency: int = 20) -> AgentsWorker:
        worker = AgentsWorker(settings, model_url, log_dir, concurrency=concurrency)
        started.append(worker)
        return worker.wait_ready()

    yield start
    for worker in started:
        worker.stop()


class StartModel(Protocol):
    def __call__(
        self, steps: list[dict[str, Any]], scripts_dir: Path | None = None
    ) -> ScriptedServer: ...


@pytest.fixture
def start_model() -> Iterator[StartModel]:
    """Start scripted models (``start_model(steps)``, and with ``scripts_dir`` the scripts it
    answers ``scripted:<name>`` from): each is stopped after the test."""
    from api.scripted.script import Script
    from api.scripted.server import ScriptedServer

    started: list[ScriptedServer] = []

    def start(steps: list[dict[str, Any]], scripts_dir: Path | None = None) -> ScriptedServer:
        server = ScriptedServer(Script.from_steps(list(steps)), scripts_dir=scripts_dir)
        server.start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.stop()


@pytest.fixture(autouse=True, scope="session")
def _python_path() -> Iterator[None]:
    """Worker processes import the test plugins from the repository."""
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), previous]))
    yield
    if previous is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = previous


#: A process-mode sandbox worker turns on the host's fs.protected_* sysctls: the machine is left
#: as the tests found it.
_HOST = HostAsFound()


def pytest_configure(config: pytest.Config) -> None:
    _HOST.start(config)


def pytest_unconfigure(config: pytest.Config) -> None:
    _HOST.finish()


# First: pytest-xdist's own hook (in each process it starts) reads the groups into the tests'
# ids, and a group given after it is never seen.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    group_shared_fixtures(items)


class Caller:
    """Calls tools by name on a fleet, the way the orchestrator does."""

    def __init__(self, dispatcher: Dispatcher, settings: WorkerSettings, run_id: str) -> None:
        self.dispatcher = dispatcher
        self.settings = settings
        self.run_id = run_id
        client = redis.Redis.from_url(settings.redis_url)
        self.specs = read_manifest(client)
        client.close()

    def spec(self, tool: str, pool: str | None = None) -> ToolSpec:
        known = self.specs.get(tool)
        if known is not None and pool is None:
            return known
        # A tool the fleet does not have, or a known one sent to another pool: crafted calls.
        base = known or tool_spec(tool)
        return base.model_copy(update={"pool": pool or base.pool})

    async def __call__(
        self,
        tool: str,
        arguments: dict[str, Any] | str,
        *,
        pool: str | None = None,
        timeout_ms: int | None = None,
        task_id: str | None = None,
        run_id: str | None = None,
        tool_call_id: str | None = None,
    ) -> ToolCallResult:
        spec = self.spec(tool, pool)
        request = self.dispatcher.build_request(
            spec,
            task_id=task_id or f"call-{uuid.uuid4().hex}",
            tool_call_id=tool_call_id,
            run_id=run_id or self.run_id,
            arguments=arguments,
            timeout_ms=timeout_ms,
        )
        return await self.dispatcher.call(request, spec.pool)


async def assert_files_round_trip(call: Caller, text: str) -> None:
    """A file the tools pool writes reads back as ``text`` from both pools: ``read_file``, and
    ``cat`` in ``run_bash``."""
    written = await call("write_file", {"path": "round-trip.txt", "content": text})
    assert not written.is_error, written.output
    assert (await call("read_file", {"path": "round-trip.txt"})).output == text
    bash = await call("run_bash", {"command": "cat round-trip.txt"})
    assert json.loads(bash.output)["stdout"] == text


@pytest.fixture
async def call(fleet: WorkerFleet) -> AsyncIterator[Caller]:
    async with Dispatcher(fleet.settings) as dispatcher:
        yield Caller(dispatcher, fleet.settings, f"run-{uuid.uuid4().hex[:12]}")
