#!/usr/bin/env python3
"""Health of a toolq container, whatever its role: ``toolq-healthcheck [api|worker]``.

Without a role it reads the container's command line (PID 1), so the image's single HEALTHCHECK
serves the API, both worker pools and the agents workers (whose Celery node answers the same
ping through the broker). Exit status 0 means healthy, 1 unhealthy.
"""

from __future__ import annotations

import socket
import sys
import urllib.request
from pathlib import Path
from typing import Any, Literal

Role = Literal["api", "worker", "none"]

DEFAULT_API_PORT = 8000
HTTP_TIMEOUT_S = 5.0
PING_TIMEOUT_S = 10.0
CELERY_APP = "worker.app"


def role_of(argv: list[str]) -> Role:
    """``toolq serve`` is the API; ``toolq worker`` or ``celery ... worker`` is a worker."""
    if "serve" in argv:
        return "api"
    if "worker" in argv:
        return "worker"
    return "none"


def api_port(argv: list[str]) -> int:
    """The port given to ``toolq serve`` (``--port N`` or ``--port=N``), else the default."""
    for index, arg in enumerate(argv):
        if arg == "--port" and index + 1 < len(argv):
            return int(argv[index + 1])
        if arg.startswith("--port="):
            return int(arg.removeprefix("--port="))
    return DEFAULT_API_PORT


def container_argv() -> list[str]:
    """PID 1's arguments; with an init (tini, docker-init) in front, toolq's are among them."""
    raw = Path("/proc/1/cmdline").read_bytes()
    return [part.decode(errors="replace") for part in raw.split(b"\0") if part]


def api_is_healthy(port: int) -> bool:
    url = f"http://127.0.0.1:{port}/healthz"
    try:
        with urllib.request.urlopen(url, timeout=HTTP_TIMEOUT_S) as response:
            return 200 <= int(response.status) < 300
    except OSError:
        return False


def worker_is_healthy(celery_app: Any, hostname: str) -> bool:
    """This host's worker answers a ping sent through the broker.

    The node name's prefix depends on how the worker was started (``celery@``, ``tools@``...),
    so the ping goes to every node on this host rather than to one guessed name.
    """
    replies = celery_app.control.ping(
        timeout=PING_TIMEOUT_S, pattern=f"*@{hostname}", matcher="glob", limit=1
    )
    return bool(replies)


def load_celery_app() -> Any:
    from celery.app.utils import find_app

    return find_app(CELERY_APP)


def main(args: list[str]) -> int:
    if args:
        if args[0] not in ("api", "worker"):
            print(
                f"usage: toolq-healthcheck [api|worker] [--port N], not {args[0]!r}",
                file=sys.stderr,
            )
            return 1
        role: Role = "api" if args[0] == "api" else "worker"
        options = args[1:]
    else:
        options = container_argv()
        role = role_of(options)
    if role == "api":
        return 0 if api_is_healthy(api_port(options)) else 1
    if role == "worker":
        return 0 if worker_is_healthy(load_celery_app(), socket.gethostname()) else 1
    # A one-shot command (toolq run, batch, demo) has no service to probe.
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
