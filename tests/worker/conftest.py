"""What the worker's tests share: tool call requests as the queue delivers them and the answers
sent back, an executor on fakeredis, each sandbox isolation mode this machine gives, a folder the
sandbox user may use."""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from api.local.stack import worker_argv, worker_environment
from tests.conftest import REPO, TEST_PLUGINS, RedisServer, wait_for
from worker.contract.fleet_secret import FleetSecret
from worker.contract.network import NetworkPolicy
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.settings import WorkerSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.contract.wire import ToolCallResult
from worker.executor import Executor
from worker.results import ResultStore
from worker.sandbox import (
    SandboxConfig,
    SandboxError,
    SandboxResult,
    describe_isolation,
    run_sandboxed,
)
from worker.sandbox.start.ready_pool import launcher
from worker.tools.workspace import Workspace

#: The built-in tools, in the order a worker registers and publishes them.
BUILT_INS = [
    "read_file",
    "write_file",
    "save_session_context",
    "list_dir",
    "mkdir",
    "remove",
    "move",
    "search_text",
    "search_files",
    "run_bash",
    "bash_session",
]
#: The caller's inbox in requests made by ``request``.
REPLY = "toolq:reply:test"

#: The user commands run as when the tests run as root (SandboxConfig's default).
NOBODY = pwd.getpwnam("nobody")

#: The uids runs take in the sandbox tests: the workers' default range.
RUN_UIDS = UidRange.parse(DEFAULT_UID_RANGE)


def request(tool: str, arguments: dict[str, Any] | str, **extra: Any) -> dict[str, Any]:
    """A call of ``tool`` in run ``run-1`` as the queue delivers it; ``extra`` overrides."""
    body: dict[str, Any] = {
        "task_id": extra.pop("task_id", f"id-{tool}-{time.monotonic_ns()}"),
        "run_id": "run-1",
        "tool": tool,
        "arguments": arguments,
        "timeout_ms": 5000,
        "deadline": time.time() + 60,
        "reply_to": REPLY,
    }
    body.update(extra)
    return body


def replies(client: fakeredis.FakeRedis) -> list[ToolCallResult]:
    """The answers sent to ``REPLY``, oldest first."""
    return [ToolCallResult.model_validate_json(r) for r in client.lrange(REPLY, 0, -1)]


def worker_settings(workspace_root: Path, **overrides: Any) -> WorkerSettings:
    """A worker's settings with the test plugins, on a broker nobody answers at."""
    return WorkerSettings(
        broker_url="redis://localhost:1/0",
        workspace_root=workspace_root,
        plugins=TEST_PLUGINS,
        **overrides,
    )


@pytest.fixture
def client() -> fakeredis.FakeRedis:
    """The result store's Redis: fakeredis, unless the module brings a real one."""
    return fakeredis.FakeRedis()


@pytest.fixture
def redis_client(redis_server: RedisServer) -> Iterator[redis.Redis]:
    """A client of the session's real Redis."""
    with redis.Redis.from_url(redis_server.url) as made:
        yield made


@pytest.fixture
def own_redis_client(own_redis: RedisServer) -> Iterator[redis.Redis]:
    """A client of a Redis of the test's own: one out of memory refuses every test sharing it."""
    with redis.Redis.from_url(own_redis.url) as made:
        yield made


#: The fleet secret of the tests' workers: answers are sealed with keys derived from it.
TEST_SECRET = FleetSecret(secrets.token_hex(32).encode(), Path("test-fleet-secret"))


@pytest.fixture
def store(client: redis.Redis) -> ResultStore:
    return ResultStore(client, 60, TEST_SECRET)


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    return worker_settings(tmp_path)


@pytest.fixture
def executor(settings: WorkerSettings, store: ResultStore) -> Executor:
    """Worker ``test-worker:1``'s executor: its results go to ``store``."""
    return Executor(settings, store, "test-worker:1")


def assert_cut_short(answer: str, item: str, total: int, what: str) -> None:
    """``answer`` shows some of ``total`` things (each line of one holds ``item``), not all, and
    counts the ``what`` it left out."""
    shown = answer.count(item)
    assert 0 < shown < total, answer
    assert f"[{total - shown:,} more {what} not shown" in answer, answer


def one_uid(**fields: Any) -> SandboxSettings:
    """Sandbox settings whose runs share one uid (no ``uid_range``): the sandbox user's as root,
    the worker's own otherwise."""
    return SandboxSettings.model_validate({"uid_range": "", **fields})


def config_for(mode: str, **options: object) -> SandboxConfig:
    """A sandbox configuration for the isolation ``mode`` a test was given."""
    return SandboxConfig(one_uid(isolation=mode, **options))


def sleeps(tag: str) -> list[int]:
    """``sleep`` processes with ``tag`` in an argument (wrappers and shells excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if Path(argv[0].decode(errors="replace")).name == "sleep" and any(
                tag.encode() in arg for arg in argv[1:]
            ):
                found.append(int(entry.name))
    return found


def orphaned_sleep(folder: Path, config: str) -> str:
    """A worker process runs ``sleep 300`` sandboxed with ``config`` (Python source of a
    ``SandboxConfig``) in ``folder``, and is killed once the command itself runs: the tag of the
    command it leaves behind (see ``sleeps``), for the test to see what ends it."""
    tag = f"{secrets.randbelow(10**6)}.{secrets.randbelow(100)}"
    script = (
        "from pathlib import Path\n"
        "from worker.sandbox import SandboxConfig, SandboxSettings, run_sandboxed\n"
        f"where = Path({str(folder)!r})\n"
        f"run_sandboxed('sleep 300 {tag}; echo', cwd=where, home=where, env={{}},\n"
        f"              timeout_ms=60000, config={config})\n"
    )
    worker = subprocess.Popen(
        [sys.executable, "-c", script], env={**os.environ, "PYTHONPATH": str(REPO)}
    )
    try:
        # The command itself, not only its wrappers: the parent-death signal is set by then.
        wait_for(lambda: bool(sleeps(tag)), 10, "the command to start")
    finally:
        worker.kill()
        worker.wait(timeout=30)
    return tag


def sandbox_worker_start(settings: WorkerSettings) -> tuple[int, list[str]]:
    """A sandbox worker started with ``settings``, expected to refuse: its exit status and the
    ``error:`` lines it said."""
    env = {**os.environ, **worker_environment(settings)}
    argv = worker_argv("sandbox", node="refusing@%h", loglevel="WARNING")
    refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    return refused.returncode, lines


def namespaces_unavailable() -> str | None:
    try:
        describe_isolation(SandboxConfig(one_uid(isolation="namespaces")))
    except SandboxError as exc:
        return str(exc)
    return None


@pytest.fixture(params=["process", pytest.param("namespaces", marks=pytest.mark.netns)])
def mode(request: pytest.FixtureRequest) -> str:
    isolation: str = request.param
    if isolation == "namespaces" and (reason := namespaces_unavailable()):
        pytest.skip(f"this machine gives no PID/network namespaces: {reason}")
    return isolation


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    """A folder under /tmp the sandbox user may use: theirs when we are root."""
    root = Path(tempfile.mkdtemp(prefix="toolq-sandbox-"))
    if os.geteuid() == 0:
        os.chown(root, NOBODY.pw_uid, NOBODY.pw_gid)
    yield root
    shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(params=["namespaces", "process"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxConfig]:
    """A sandbox worker's configuration in each mode this machine gives, per-run uids on, its
    workspaces below ``tmp_path``; the process's ready launches let go after the test."""
    root = tmp_path / "workspaces"
    root.mkdir()
    tmp_path.chmod(0o755)
    made = SandboxConfig(
        SandboxSettings(isolation=request.param, uid_range=str(RUN_UIDS)), workspace_root=str(root)
    )
    try:
        describe_isolation(made)
    except SandboxError as exc:  # the machine cannot give this mode
        pytest.skip(f"{request.param}: {exc}")
    yield made
    launcher.release()


def run_in_workspace(
    config: SandboxConfig,
    workspace: Workspace,
    command: str,
    stdin: bytes | None = None,
    before_start: Callable[[], None] | None = None,
    network: NetworkPolicy | None = None,
    timeout_ms: int = 10_000,
) -> SandboxResult:
    """``command`` as run_bash runs it in ``workspace``: as the run's uid, in its folder."""
    return run_sandboxed(
        command,
        cwd=workspace.root,
        home=workspace.root,
        env={},
        timeout_ms=timeout_ms,
        config=config,
        identity=workspace.owner,
        stdin=stdin,
        before_start=before_start,
        network=network,
    )
