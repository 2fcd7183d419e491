"""``toolq serve``: the checks before listening, uvicorn, and the signals that stop it.

Light to import: the port is taken before the server's own imports (FastAPI, the model client),
which cost a second or more, so that a port in use is said at once.
"""

from __future__ import annotations

import ipaddress
import logging
import signal
import socket
import sys
from types import FrameType
from typing import NoReturn

from api.exceptions import TokensFileError
from api.http.tenants import Tenants
from api.process.listening import listen
from api.settings import OrchestratorSettings, get_settings

log = logging.getLogger(__name__)

#: Wrong settings or options; anything that stops the server from starting otherwise is 1.
EXIT_USAGE, EXIT_FAILED = 2, 1


def serve(host: str, port: int, *, settings: OrchestratorSettings | None = None) -> None:
    """Serve the API until interrupted. Without a broker (local mode) a private Redis and one
    worker per pool run for the server's lifetime.

    The port is taken first: a port in use is said at once, before a local stack starts.
    """
    settings = settings or get_settings()
    try:
        tenants = Tenants.from_settings(settings)
    except TokensFileError as exc:
        _refuse(str(exc))
    if tenants.is_open and not is_loopback(host):
        _refuse(
            f"refusing to listen on {host} without TOOLQ_API_TOKEN: anyone who can reach it "
            "could run agents and tools. Set TOOLQ_API_TOKEN (or TOOLQ_API_TOKENS_FILE), or "
            "listen on 127.0.0.1."
        )
    listener = listen(host, port)
    try:
        _serve_on(listener, host, port, settings, tenants)
    finally:
        listener.close()


def _serve_on(
    listener: socket.socket,
    host: str,
    port: int,
    settings: OrchestratorSettings,
    tenants: Tenants,
) -> None:
    # Imported once the port is ours (see the module's docstring).
    import uvicorn

    from api.conversation.placement import fleet_started, place
    from api.exceptions import FleetUnreachableError, LocalStackError
    from api.http.app import create_app
    from api.process.connections import check_connections
    from api.process.logs import configure_logging

    configure_logging(settings)
    if settings.local_mode:
        log.info("no TOOLQ_BROKER_URL: starting a local Redis and workers for this server")
    else:
        try:
            check_connections(settings)
        except FleetUnreachableError as exc:
            _refuse(str(exc), EXIT_FAILED)
    # uvicorn re-raises the signal that stopped it once it has shut down; as an exception it
    # unwinds through fleet_started, which stops the local stack instead of leaving it orphaned.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _exit_cleanly)
    try:
        with fleet_started(settings, place(settings)) as fleet_settings:
            # Without a model API it serves /mcp, the viewer and the fleet: runs answer 503.
            app = create_app(fleet_settings, tenants=tenants)
            config = uvicorn.Config(
                app, host=host, port=port, log_config=None, timeout_graceful_shutdown=5
            )
            uvicorn.Server(config).run(sockets=[listener])
    except LocalStackError as exc:
        _refuse(f"the local stack did not start: {exc}", EXIT_FAILED)


def is_loopback(host: str) -> bool:
    """Only this machine can reach ``host``: localhost, 127.0.0.0/8 or ::1."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a name: it may resolve to anything


def _exit_cleanly(signum: int, _: FrameType | None) -> None:
    raise SystemExit(0)


def _refuse(message: str, status: int = EXIT_USAGE) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(status)
