"""An HTTP server in a network namespace of the test's own, reached from the machine over a
veth pair: an address that is neither the machine's nor the outside world's, as a package index
or a company mirror would be to a run."""

from __future__ import annotations

import contextlib
import secrets
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass

#: Each server takes one random /30 of 10.214.0.0/16: the machine's end .1, the server's .2.
_PREFIX = "10.214"
_SERVE = """
import http.server, sys
body = sys.argv[2].encode()
class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *args):
        pass
http.server.ThreadingHTTPServer((sys.argv[1], int(sys.argv[3])), Answer).serve_forever()
"""


@dataclass(frozen=True)
class Served:
    """A server's address and port, the machine's address on the same link, and what the
    server answers."""

    address: str
    port: int
    machine_address: str
    body: str


def _ip(*argv: str) -> None:
    subprocess.run(["ip", *argv], check=True, capture_output=True, timeout=30)


def _serve(where: list[str], address: str, port: int, body: str) -> subprocess.Popen[bytes]:
    server = subprocess.Popen([*where, "/usr/bin/python3", "-c", _SERVE, address, body, str(port)])
    deadline = time.monotonic() + 30
    while True:
        probe = subprocess.run(
            [
                *where,
                "/usr/bin/python3",
                "-c",
                f"import socket; socket.create_connection(({address!r}, {port}), 2).close()",
            ],
            capture_output=True,
            timeout=30,
        )
        if probe.returncode == 0:
            return server
        if server.poll() is not None or time.monotonic() > deadline:
            server.kill()
            raise RuntimeError(f"the test server on {address}:{port} did not start")
        time.sleep(0.05)


@contextlib.contextmanager
def served_in_namespace(ports: tuple[int, ...]) -> Iterator[tuple[list[Served], Served]]:
    """Servers on ``ports`` of an address in a namespace of the test's own, and one on the
    machine's own end of the link (an address of the host's, which no run may reach)."""
    tag = secrets.token_hex(3)
    namespace, outside, inside = f"tq-egress-{tag}", f"tqe{tag}h", f"tqe{tag}n"
    third, fourth = secrets.randbelow(256), secrets.randbelow(64) * 4
    machine = f"{_PREFIX}.{third}.{fourth + 1}"
    server = f"{_PREFIX}.{third}.{fourth + 2}"
    started: list[subprocess.Popen[bytes]] = []
    _ip("netns", "add", namespace)
    try:
        _ip("link", "add", outside, "type", "veth", "peer", "name", inside, "netns", namespace)
        _ip("addr", "add", f"{machine}/30", "dev", outside)
        _ip("link", "set", outside, "up")
        inside_ns = ["ip", "netns", "exec", namespace]
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"{server}/30", "dev", inside)
        _ip("netns", "exec", namespace, "ip", "link", "set", inside, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        servers = []
        for port in ports:
            body = f"answer from {server}:{port} {secrets.token_hex(4)}"
            started.append(_serve(inside_ns, server, port, body))
            servers.append(Served(server, port, machine, body))
        host_port = free_port()
        host_body = f"the machine's own address {secrets.token_hex(4)}"
        started.append(_serve([], machine, host_port, host_body))
        yield servers, Served(machine, host_port, machine, host_body)
    finally:
        for proc in started:
            proc.kill()
            proc.wait(timeout=30)
        with contextlib.suppress(subprocess.CalledProcessError):
            _ip("link", "del", outside)
        _ip("netns", "del", namespace)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
