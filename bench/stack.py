"""The processes a benchmark runs against: a private Redis, toolq's workers, bare Celery's."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import redis

from api.local.stack import (
    LocalStack,
    free_port,
    pings,
    redis_server_binary,
    worker_environment,
)
from bench import bare_celery
from worker.contract.settings import WorkerSettings

REPO = Path(__file__).resolve().parents[1]
#: Said wherever toolq is compared with bare Celery: the two differ in this, besides the task.
TRANSPORT_NOTE = (
    "toolq's workers and callers run kombu's Redis transport with one Redis client per channel "
    "(worker/plumbing/redis_transport.py); bare Celery runs kombu's own, which builds a "
    "client for each "
    "message it publishes, each acknowledgement and each task event: five per task in the "
    "workers' consumer, each costing more CPU than the round trip it is built for (redis-py 8)."
)
PLUGIN = "bench.noop_plugin"
START_TIMEOUT_S = 60.0


def wait_until(ready: Callable[[], bool], what: str, timeout: float = START_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not happen within {timeout:.0f} s")
        time.sleep(0.02)


def python_path() -> str:
    """PYTHONPATH with the repository first: workers import ``bench.noop_plugin`` from it."""
    previous = os.environ.get("PYTHONPATH")
    return os.pathsep.join(filter(None, [str(REPO), previous]))


def run_checked(
    argv: list[str], env: dict[str, str], what: str, *, timeout: float, cwd: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``argv`` run to its end, its output captured as text; when it fails, ``RuntimeError``
    with the end of its stderr, saying ``what`` failed."""
    done = subprocess.run(
        argv, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stderr[-4000:]}")
    return done


def bench_settings(broker_url: str, workspace_root: Path) -> WorkerSettings:
    return WorkerSettings(
        broker_url=broker_url,
        result_backend=broker_url,
        workspace_root=workspace_root,
        plugins=[PLUGIN],
    )


@contextlib.contextmanager
def private_redis() -> Iterator[str]:
    """A redis-server of the benchmark's own on a free port, without persistence."""
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="toolq-bench-redis-")
    proc = subprocess.Popen(
        [
            redis_server_binary(),
            "--port",
            str(port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            workdir,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"redis://127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        wait_until(lambda: pings(client), "redis-server answering")
        yield url
    finally:
        client.close()
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)


@contextlib.contextmanager
def toolq_workers(
    settings: WorkerSettings, concurrency: int, pools: tuple[str, ...]
) -> Iterator[LocalStack]:
    """toolq's own workers (``celery -A worker.app worker``), one per pool."""
    os.environ["PYTHONPATH"] = python_path()
    stack = LocalStack(settings, plugins=[PLUGIN], concurrency=concurrency, pools=pools)
    try:
        stack.start_workers(settings)
        yield stack
    finally:
        stack.stop()


class BareWorker:
    """``celery -A bench.bare_celery worker`` with the flags toolq's local workers get."""

    def __init__(
        self, settings: WorkerSettings, concurrency: int, *, node: str | None = None
    ) -> None:
        """``node``: the worker's node name, where several run side by side."""
        # Kept open for the worker's lifetime and deleted when closed in ``stop``.
        self._log = tempfile.NamedTemporaryFile(prefix="toolq-bench-bare-", suffix=".log")  # noqa: SIM115
        env = {**os.environ, **worker_environment(settings), "PYTHONPATH": python_path()}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                "bench.bare_celery",
                "worker",
                "-Q",
                bare_celery.QUEUE,
                "-n",
                node or f"bare-{os.getpid()}@%h",
                "-c",
                str(concurrency),
                "--loglevel",
                "WARNING",
                "--without-gossip",
                "--without-mingle",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
        self.app = bare_celery.create_app(settings)
        self.task = self.app.tasks[bare_celery.NOOP_TASK]

    def wait_ready(self) -> None:
        """Ready once a task comes back: the first one also warms the connections."""
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the bare Celery worker exited:\n{self._log_tail()}")
            with contextlib.suppress(Exception):
                self.task.apply_async().get(timeout=2)
                return
        raise RuntimeError(f"the bare Celery worker did not answer:\n{self._log_tail()}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            # Nothing is in flight by now: a cold shutdown spares the warm one's wait.
            self.proc.send_signal(signal.SIGQUIT)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.app.close()
        self._log.close()

    def _log_tail(self) -> str:
        return Path(self._log.name).read_text(errors="replace")[-4000:]


@contextlib.contextmanager
def bare_worker(settings: WorkerSettings, concurrency: int) -> Iterator[BareWorker]:
    worker = BareWorker(settings, concurrency)
    try:
        worker.wait_ready()
        yield worker
    finally:
        worker.stop()
