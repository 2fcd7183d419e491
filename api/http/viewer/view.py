"""``toolq view OUTPUT.jsonl``: a batch's results file in the viewer, on this machine only.

A read-only server on 127.0.0.1 and a free port, with no fleet, no Redis and no token (nobody
else can reach it): the URL is printed, and opened in a browser where there is one.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import webbrowser
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import FrameType

import uvicorn
from fastapi import FastAPI

from api.http.viewer.results_file import ResultsFileSource, results_path_problem
from api.http.viewer.routes import mount_viewer
from api.http.viewer.viewer import Viewer
from api.process.listening import listen

HOST = "127.0.0.1"


def create_view_app(path: Path) -> FastAPI:
    """The viewer of one results file; indexing starts with the app and stops with it."""
    source = ResultsFileSource(path)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        source.start()
        try:
            yield
        finally:
            await source.close()

    app = FastAPI(
        title="toolq view", lifespan=lifespan, openapi_url=None, docs_url=None, redoc_url=None
    )
    viewer = Viewer(source, name="toolq view", single_batch=source.batch_id)
    mount_viewer(app, viewer, guard=[])
    return app


def view_results(path: Path, *, port: int = 0, open_browser: bool = True) -> int:
    """Serve ``path`` until interrupted; returns the exit code."""
    problem = results_path_problem(path)
    if problem is not None:
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # Bound and listening before the URL is printed: whoever opens it at once is answered.
    listener = listen(HOST, port, backlog=128)
    url = f"http://{HOST}:{listener.getsockname()[1]}/"
    print(f"toolq view: {path} at {url} (read-only; Ctrl-C to stop)", flush=True)
    if open_browser and _has_browser():
        threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()
    config = uvicorn.Config(
        create_view_app(path.resolve()),
        log_config=None,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=2,
    )
    # uvicorn re-raises the signal that stopped it once it has shut down: a stop, not a failure.
    for stop_signal in (signal.SIGTERM, signal.SIGINT):
        signal.signal(stop_signal, _stopped)
    try:
        uvicorn.Server(config).run(sockets=[listener])
    except SystemExit as stopped:
        return int(stopped.code or 0)
    return 0


def _stopped(signum: int, _: FrameType | None) -> None:
    raise SystemExit(0)


def _has_browser() -> bool:
    """A graphical browser can be opened: never a text one that would take over the terminal."""
    if sys.platform in ("darwin", "win32"):
        return True
    return bool(os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"))
