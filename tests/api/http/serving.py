"""A `toolq serve` process of the tests' own, on real workers and a scripted model."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import httpx
import uvicorn
from fastapi import FastAPI

from api.local.stack import free_port, worker_environment
from api.scripted.server import ScriptedServer
from tests.conftest import WorkerFleet, wait_for

TOOLQ = str(Path(sys.executable).parent / "toolq")


def serve_environment(fleet: WorkerFleet, model: ScriptedServer, token: str) -> dict[str, str]:
    """What `toolq serve` needs to use ``fleet`` and ``model``, behind ``token``."""
    return {
        **os.environ,
        **worker_environment(fleet.settings),
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "test",
        "TOOLQ_API_TOKEN": token,
        "TOOLQ_LOG_FORMAT": "json",
    }


class Replica:
    """One `toolq serve` process on its own port."""

    def __init__(self, env: dict[str, str], log_dir: Path, name: str, token: str) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.env = env
        self.log_path = log_dir / f"{name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.client = httpx.Client(
            base_url=self.url, headers={"Authorization": f"Bearer {token}"}, timeout=30
        )

    def start(self) -> Replica:
        self.launch()
        return self.ready()

    @contextmanager
    def running(self) -> Iterator[Replica]:
        """Started; stopped, its client closed, however the block ends."""
        try:
            yield self.start()
        finally:
            self.stop()
            self.client.close()

    def launch(self) -> None:
        with self.log_path.open("ab") as log:
            self.proc = subprocess.Popen(
                [TOOLQ, "serve", "--host", "127.0.0.1", "--port", str(self.port)],
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )

    def ready(self) -> Replica:
        wait_for(self._healthy, 30, f"toolq serve on {self.port}:\n{self.log()}")
        return self

    def _healthy(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"toolq serve exited {self.proc.returncode}:\n{self.log()}")
        try:
            return self.client.get("/healthz").status_code == 200
        except httpx.TransportError:
            return False

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=30)
        self.proc = None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    @property
    def replica_id(self) -> str:
        replica: str = self.client.get("/healthz").json()["replica"]
        return replica

    def create_run(self, script: str, prompt: str | None = None) -> str:
        body = {
            "prompt": prompt or f"remember {uuid.uuid4().hex}",
            "options": {"model": f"scripted:{script}"},
        }
        response = self.client.post("/v1/runs", json=body)
        assert response.status_code == 202, response.text
        run_id: str = response.json()["id"]
        return run_id

    def run(self, run_id: str) -> dict[str, Any]:
        response = self.client.get(f"/v1/runs/{run_id}")
        assert response.status_code == 200, response.text
        run: dict[str, Any] = response.json()
        return run

    def events(self, run_id: str) -> list[dict[str, Any]]:
        response = self.client.get(f"/v1/runs/{run_id}/events")
        assert response.status_code == 200, response.text
        return [
            json.loads(line.removeprefix("data: "))
            for line in response.text.splitlines()
            if line.startswith("data: ")
        ]

    def wait_status(self, run_id: str, *statuses: str, timeout: float = 30) -> dict[str, Any]:
        wait_for(
            lambda: self.run(run_id)["status"] in statuses,
            timeout,
            f"run {run_id} to be {'/'.join(statuses)}",
        )
        return self.run(run_id)


@contextmanager
def two_replicas(
    env: dict[str, str], log_dir: Path, token: str
) -> Iterator[tuple[Replica, Replica]]:
    """Two replicas, ``a`` and ``b``, of one API started side by side (both launched before
    either is waited on); both stopped however the block ends."""
    first, second = Replica(env, log_dir, "a", token), Replica(env, log_dir, "b", token)
    try:
        first.launch()
        second.launch()
        yield first.ready(), second.ready()
    finally:
        first.stop()
        second.stop()


@asynccontextmanager
async def served_in_thread(app: FastAPI, **options: Any) -> AsyncIterator[str]:
    """``app`` under uvicorn, in a thread of this process, with uvicorn's ``options`` (its
    log level "warning" unless they say otherwise); its base URL."""
    port = free_port()
    options.setdefault("log_level", "warning")
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, **options))
    thread = threading.Thread(target=server.run, name="app-under-test", daemon=True)
    thread.start()
    try:
        await asyncio.to_thread(wait_for, lambda: server.started, 30, "the app to serve")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        await asyncio.to_thread(thread.join, 30)
