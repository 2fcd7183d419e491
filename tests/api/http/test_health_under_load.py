"""The health probe under a burst of followers: ``/healthz`` on a real `toolq serve` answers
while a thousand clients are still connecting to a run's events, not after all of them.

The followers are plain sockets that send their request and wait, so that this process spends
nothing on them while it times the probe.
"""

from __future__ import annotations

import http.client
import socket
import statistics
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from tests.api.http.conftest import TOKEN
from tests.api.http.serving import Replica
from tests.conftest import wait_for

pytestmark = pytest.mark.integration

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    # Thinks until it is cancelled: every attempt stalls past the model client's timeout.
    "stuck": [{"content": "never", "fault": {"kind": "stall", "seconds": 600, "times": 20}}],
}
FOLLOWERS = 1000
#: How many times slower than on an idle server the probe may answer under the burst: generous
#: (an idle probe takes a millisecond or two, one behind the burst's bare connections a few
#: hundred; one that waited for every follower's start took seconds, over a thousand times more).
SLOWDOWN_ALLOWED = 500
#: An idle server's probe is timed this often; the median counts.
IDLE_PROBES = 7


def probe_seconds(port: int) -> float:
    """How long one GET /healthz takes to answer 200."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        started = time.perf_counter()
        connection.request("GET", "/healthz")
        answer = connection.getresponse()
        answer.read()
        took = time.perf_counter() - started
    finally:
        connection.close()
    assert answer.status == 200
    return took


@contextmanager
def followers(port: int, run_id: str, count: int) -> Iterator[list[socket.socket]]:
    """``count`` connections, each having sent its request for the run's events; closed after."""
    request = (
        f"GET /v1/runs/{run_id}/events HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        f"Authorization: Bearer {TOKEN}\r\nAccept: text/event-stream\r\n\r\n"
    ).encode()
    with ExitStack() as stack:
        sockets = []
        for _ in range(count):
            sock = stack.enter_context(socket.create_connection(("127.0.0.1", port), timeout=60))
            sock.sendall(request)
            # Blocking, with no timeout: a recv with MSG_DONTWAIT then never waits.
            sock.settimeout(None)
            sockets.append(sock)
        yield sockets


def answered(sock: socket.socket) -> bool:
    """Whether the server has begun answering ``sock``'s request (without waiting)."""
    try:
        return bool(sock.recv(64, socket.MSG_PEEK | socket.MSG_DONTWAIT))
    except BlockingIOError:
        return False


@pytest.mark.timeout(300)
def test_healthz_answers_while_a_thousand_followers_are_still_connecting(server: Replica) -> None:
    idle = statistics.median(probe_seconds(server.port) for _ in range(IDLE_PROBES))
    run_id = server.create_run("stuck")
    with followers(server.port, run_id, FOLLOWERS) as streams:
        # The probe goes out right behind the last follower's request.
        loaded = probe_seconds(server.port)
        waiting = sum(1 for sock in streams if not answered(sock))
        wait_for(
            lambda: all(answered(sock) for sock in streams),
            120,
            f"all {FOLLOWERS} followers to be answered",
        )
        for sock in streams:
            assert sock.recv(64).startswith(b"HTTP/1.1 200"), "a follower was refused"
    timings = f"{loaded * 1000:.0f} ms under the burst, {idle * 1000:.1f} ms on an idle server"
    assert waiting >= FOLLOWERS // 2, (
        f"/healthz answered only once {FOLLOWERS - waiting} of {FOLLOWERS} followers had been "
        f"({timings})"
    )
    assert loaded <= idle * SLOWDOWN_ALLOWED, timings
