"""toolq-healthcheck (deploy/healthcheck.py): the health check of every role of the image."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import ModuleType

import pytest
from celery import Celery
from celery.contrib.testing.worker import start_worker

from tests.deploy.deployfiles import healthcheck_module

REDIS_URL = "redis://127.0.0.1:6379/13"


@pytest.fixture
def healthcheck() -> ModuleType:
    return healthcheck_module()


class _Health(BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def _serve(status: int) -> Iterator[int]:
    handler = type("Handler", (_Health,), {"status": status})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


@pytest.fixture
def healthy_api() -> Iterator[int]:
    yield from _serve(200)


@pytest.fixture
def failing_api() -> Iterator[int]:
    yield from _serve(503)


@pytest.mark.parametrize(
    ("argv", "role"),
    [
        (["/opt/venv/bin/python", "/opt/venv/bin/toolq", "serve", "--host", "0.0.0.0"], "api"),
        (["/sbin/docker-init", "--", "toolq", "serve", "--port", "8000"], "api"),
        # What `toolq worker --pool sandbox` execs.
        (
            ["/opt/venv/bin/python", "-m", "celery", "-A", "worker.app", "worker", "-Q", "sandbox"],
            "worker",
        ),
        (["/opt/venv/bin/python", "/opt/venv/bin/toolq", "batch", "in.jsonl", "-o", "o"], "none"),
    ],
)
def test_role_is_read_from_the_command_line(
    healthcheck: ModuleType, argv: list[str], role: str
) -> None:
    assert healthcheck.role_of(argv) == role


@pytest.mark.parametrize(
    ("argv", "port"),
    [(["serve", "--port", "9000"], 9000), (["serve", "--port=9001"], 9001), (["serve"], 8000)],
)
def test_api_port_is_read_from_the_command_line(
    healthcheck: ModuleType, argv: list[str], port: int
) -> None:
    assert healthcheck.api_port(argv) == port


def test_api_answering_healthz_is_healthy(healthcheck: ModuleType, healthy_api: int) -> None:
    assert healthcheck.main(["api", "--port", str(healthy_api)]) == 0


def test_api_answering_an_error_is_unhealthy(healthcheck: ModuleType, failing_api: int) -> None:
    assert healthcheck.main(["api", "--port", str(failing_api)]) == 1


def test_api_not_listening_is_unhealthy(healthcheck: ModuleType) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    assert healthcheck.main(["api", "--port", str(closed_port)]) == 1


def test_an_unknown_role_is_refused_with_usage(
    healthcheck: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    assert healthcheck.main(["web"]) == 1
    assert "usage: toolq-healthcheck [api|worker]" in capsys.readouterr().err


@pytest.mark.integration
def test_worker_answering_a_ping_through_the_broker_is_healthy(
    healthcheck: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    app = Celery("healthcheck-test", broker=REDIS_URL, backend=REDIS_URL)
    host = f"host-{uuid.uuid4().hex[:12]}"
    monkeypatch.setattr(healthcheck, "PING_TIMEOUT_S", 1.0)
    # Named as `toolq worker` names nodes (<pool>@<host>), not celery@<host>.
    with start_worker(app, hostname=f"sandbox@{host}", perform_ping_check=False):
        assert healthcheck.worker_is_healthy(app, host) is True
        assert healthcheck.worker_is_healthy(app, f"other-{host}") is False
