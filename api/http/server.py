"""``toolq serve``: the checks before listening, uvicorn, and the signals that stop it."""

from __future__ import annotations

import logging
import signal
import sys
from types import FrameType
from typing import NoReturn

import uvicorn

from api.http.app import create_app
from api.http.auth import is_loopback
from api.llm import ChatModel, ModelError
from api.local.stack import LocalStackError, fleet_for
from api.settings import OrchestratorSettings, get_settings

log = logging.getLogger(__name__)


def serve(host: str, port: int, *, settings: OrchestratorSettings | None = None) -> None:
    """Serve the API until interrupted. Without a broker (local mode) a private Redis and one
    worker per pool run for the server's lifetime."""
    from api.logs import configure_logging

    settings = settings or get_settings()
    try:
        settings.redis_url  # noqa: B018 - an amqp broker needs TOOLQ_RESULT_BACKEND
    except ValueError as exc:
        _refuse(str(exc))
    if not settings.api_token and not is_loopback(host):
        _refuse(
            f"refusing to listen on {host} without TOOLQ_API_TOKEN: anyone who can reach it "
            "could run agents and tools. Set TOOLQ_API_TOKEN, or listen on 127.0.0.1."
        )
    configure_logging(settings)
    try:
        model = ChatModel.from_env(settings)
    except ModelError as exc:
        _refuse(f"no model API configured: {exc}")
    if settings.local_mode:
        log.info("no TOOLQ_BROKER_URL: starting a local Redis and workers for this server")
    # uvicorn re-raises the signal that stopped it once it has shut down; as an exception it
    # unwinds through fleet_for, which stops the local stack instead of leaving it orphaned.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _exit_cleanly)
    try:
        with fleet_for(settings) as fleet_settings:
            app = create_app(fleet_settings, model=model)
            config = uvicorn.Config(
                app, host=host, port=port, log_config=None, timeout_graceful_shutdown=5
            )
            uvicorn.Server(config).run()
    except LocalStackError as exc:
        print(f"error: the local stack did not start: {exc}", file=sys.stderr)
        raise SystemExit(1) from exc


def _exit_cleanly(signum: int, _: FrameType | None) -> None:
    raise SystemExit(0)


def _refuse(message: str) -> NoReturn:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
