"""A local OpenAI-compatible chat server that replays scripted answers.

It stands in for a real model in tests, in ``toolq demo`` (and ``toolq scripted-llm``) and in
benchmarks. ``api.scripted.script`` says what it answers and when it fails; this module writes
those answers as the chat completions API does, plays the faults, and serves them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import http.client
import json
import socket
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import uvicorn
from pydantic import BaseModel, ConfigDict, Field, ValidationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from api.process.background import Background
from api.process.listening import listen
from api.scripted.script import (
    DEFAULT_SCRIPT_PATH,
    SHIPPED_SCRIPTS_DIR,
    CutFault,
    Fault,
    GarbageFault,
    Script,
    StatusFault,
    count_prompt_tokens,
    load_scripts,
    problems,
)

MODEL_PREFIX = "scripted:"
DEFAULT_MODEL = "scripted"
#: How long ``ScriptedServer.start`` waits for the server to answer.
STARTUP_TIMEOUT_S = 10.0


# --- Answers that fail ---------------------------------------------------------------------------


def _error(status: int, message: str, code: str | None = None, **headers: str) -> Response:
    error_type = "server_error" if status >= 500 else "invalid_request_error"
    body = {"error": {"message": message, "type": error_type, "param": None, "code": code}}
    return Response(
        json.dumps(body), status_code=status, media_type="application/json", headers=headers
    )


_GARBAGE = b"<html><body>502 Bad Gateway</body></html>"
_GARBAGE_EVENT = b"data: " + _GARBAGE + b"\n\n"


class _CutResponse(Response):
    """Sends the first part of a body and returns without finishing it.

    The server then closes the connection mid-body, as a crashed proxy would; it logs one
    "returned without completing response" line each time, which is the point.
    """

    def __init__(self, parts: list[bytes], media_type: str, declared_length: int | None) -> None:
        super().__init__(media_type=media_type)
        self.parts = parts
        self.declared_length = declared_length

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        headers = [(b"content-type", self.media_type.encode())] if self.media_type else []
        if self.declared_length is not None:
            headers.append((b"content-length", str(self.declared_length).encode()))
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        for part in self.parts:
            await send({"type": "http.response.body", "body": part, "more_body": True})


# --- The application -----------------------------------------------------------------------------


class _Stats:
    def __init__(self) -> None:
        self.requests = 0
        self.streamed = 0
        self.bad_requests = 0
        self.faults: Counter[str] = Counter()

    def as_dict(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "streamed": self.streamed,
            "bad_requests": self.bad_requests,
            "faults": {kind: self.faults[kind] for kind in ("status", "garbage", "cut", "stall")},
        }


class _StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True)

    include_usage: bool = False


class ChatRequest(BaseModel):
    """The parts of a chat completion request the scripted model looks at; it ignores the rest."""

    model_config = ConfigDict(strict=True)

    model: str = Field(min_length=1)
    messages: list[dict[str, Any]]
    stream: bool = False
    stream_options: _StreamOptions | None = None

    @classmethod
    def parse(cls, raw: bytes) -> ChatRequest:
        """Raises ``ValueError`` with a message for the client when the request is unusable."""
        try:
            return cls.model_validate_json(raw)
        except ValidationError as exc:
            if any(error["type"] == "json_invalid" for error in exc.errors()):
                raise ValueError("the request body is not valid JSON") from None
            raise ValueError(problems(exc, "the request body")) from None

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class _ScriptedModel:
    """Chooses the script and step for a request, plays faults, and counts what it served."""

    def __init__(self, default: Script, scripts: dict[str, Script]) -> None:
        self.default = default
        self.scripts = scripts
        self.stats = _Stats()
        # Failed attempts so far, per (model, messages) digest; only steps with faults add keys.
        self.fault_attempts: Counter[bytes] = Counter()

    def model_names(self) -> list[str]:
        return [DEFAULT_MODEL, *(MODEL_PREFIX + name for name in sorted(self.scripts))]

    async def answer(self, request: Request) -> Response:
        self.stats.requests += 1
        try:
            chat = ChatRequest.parse(await request.body())
        except ValueError as exc:
            self.stats.bad_requests += 1
            return _error(400, str(exc))
        script = self._script_for(chat.model)
        if script is None:
            known = ", ".join(self.model_names())
            return _error(404, f"no script named {chat.model!r}; known: {known}", "model_not_found")
        if chat.stream:
            self.stats.streamed += 1

        assistant_turns = sum(1 for m in chat.messages if m.get("role") == "assistant")
        step = script.step_for(assistant_turns)
        answer = step.answer(chat.messages)
        tokens = count_prompt_tokens(chat.messages)
        if chat.stream:
            body = answer.sse_events(chat.model, tokens, chat.include_usage)
        else:
            body = [json.dumps(answer.completion(chat.model, tokens)).encode()]

        if step.fault is not None and self._should_fail(chat, step.fault.times):
            self.stats.faults[step.fault.kind] += 1
            failure = await self._play_fault(step.fault, chat.stream, body, request)
            if failure is not None:
                return failure

        if chat.stream:
            return StreamingResponse(_iterate(body), media_type="text/event-stream")
        return Response(body[0], media_type="application/json")

    def _script_for(self, model: str) -> Script | None:
        if model.startswith(MODEL_PREFIX):
            return self.scripts.get(model.removeprefix(MODEL_PREFIX))
        return self.default

    def _should_fail(self, chat: ChatRequest, times: int) -> bool:
        key = hashlib.blake2b(
            json.dumps([chat.model, chat.messages], sort_keys=True).encode(), digest_size=16
        ).digest()
        failed = self.fault_attempts[key]
        if failed >= times:
            return False
        self.fault_attempts[key] = failed + 1
        return True

    async def _play_fault(
        self, fault: Fault, stream: bool, body: list[bytes], request: Request
    ) -> Response | None:
        """The failing response, or None when the fault only delays the normal answer."""
        if isinstance(fault, StatusFault):
            headers = {}
            if fault.retry_after is not None:
                headers["retry-after"] = f"{fault.retry_after:g}"
                headers["retry-after-ms"] = f"{fault.retry_after * 1000:.0f}"
            return _error(fault.status, f"scripted fault: HTTP {fault.status}", **headers)
        if isinstance(fault, GarbageFault):
            if stream:
                return Response(_GARBAGE_EVENT, media_type="text/event-stream")
            return Response(_GARBAGE, media_type="application/json")
        if isinstance(fault, CutFault):
            if stream:  # about half the events, always short of the finish_reason chunk
                return _CutResponse(body[: (len(body) - 3) // 2 + 1], "text/event-stream", None)
            whole = body[0]
            return _CutResponse([whole[: len(whole) // 2]], "application/json", len(whole))
        # A client that gave up has gone: stop waiting then, so no request outlives its client.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(_disconnected(request), fault.seconds)
        return None


async def _disconnected(request: Request) -> None:
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _iterate(events: list[bytes]) -> AsyncIterator[bytes]:
    for event in events:
        yield event


def create_scripted_app(script: Script | None = None, scripts_dir: Path | None = None) -> Starlette:
    """The scripted model's app.

    ``script`` answers every model name not of the form ``scripted:<name>`` (default: the shipped
    demo); ``scripted:<name>`` picks ``<name>.json`` from ``scripts_dir`` (default: the shipped
    scripts).

    A Starlette app, not a FastAPI one: its three routes read and write plain JSON by hand, and
    FastAPI's layers around each request (its middleware, its dependency solving) cost a quarter
    of the server's CPU per chat request, which a benchmark's scripted model spends on the same
    cores as the fleet it stands beside.
    """
    scripts = load_scripts(scripts_dir or SHIPPED_SCRIPTS_DIR)
    model = _ScriptedModel(script or Script.load(DEFAULT_SCRIPT_PATH), scripts)

    async def list_models(_: Request) -> Response:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "toolq"}
            for name in model.model_names()
        ]
        return JSONResponse({"object": "list", "data": data})

    async def stats(_: Request) -> Response:
        return JSONResponse(model.stats.as_dict())

    return Starlette(
        routes=[
            Route("/v1/chat/completions", model.answer, methods=["POST"]),
            Route("/v1/models", list_models, methods=["GET"]),
            Route("/stats", stats, methods=["GET"]),
        ],
        exception_handlers={404: _not_served, 405: _not_served},
    )


async def _not_served(request: Request, exc: Exception) -> Response:
    """A route or method the scripted model does not serve, said as the chat API says errors,
    so that a client reading ``error.message`` learns what it asked for and what is served."""
    status = getattr(exc, "status_code", 404)
    asked = f"{request.method} {request.url.path}"
    served = "POST /v1/chat/completions, GET /v1/models, GET /stats"
    # A 405's Allow header (the methods the path takes) goes with it, as Starlette sends it.
    headers = getattr(exc, "headers", None) or {}
    return _error(
        status, f"the scripted model does not serve {asked}; it serves {served}", **headers
    )


# --- Running it ----------------------------------------------------------------------------------


def _uvicorn_config(app: Starlette, **options: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        backlog=4096,
        timeout_graceful_shutdown=1,
        # Nothing it answers depends on the client's address: no proxy's headers to read.
        proxy_headers=False,
        **options,
    )


class ScriptedServer(Background):
    """The scripted model on 127.0.0.1 and a free port, served from a background thread."""

    def __init__(self, script: Script | None = None, *, scripts_dir: Path | None = None) -> None:
        self._app = create_scripted_app(script, scripts_dir)
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None
        self._socket: socket.socket | None = None
        self.port = 0

    @property
    def base_url(self) -> str:
        """The OpenAI base URL, e.g. ``http://127.0.0.1:PORT/v1``."""
        if not self.port:
            raise RuntimeError("the scripted server is not running; call start() first")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> None:
        """Start serving; returns once the server answers, or raises after the start-up timeout."""
        if self._thread is not None:
            return
        sock = self._socket = listen("127.0.0.1", 0)
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(_uvicorn_config(self._app, log_level="warning", access_log=False))
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while not server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("the scripted model server did not start")
            time.sleep(0.005)
        self.stats()  # the server answers

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._socket is not None:
            self._socket.close()
        self._server = self._thread = self._socket = None
        self.port = 0

    def stats(self) -> dict[str, Any]:
        """What ``GET /stats`` reports: requests served, streamed, bad, and faults by kind."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=5)
        try:
            connection.request("GET", "/stats")
            result: dict[str, Any] = json.loads(connection.getresponse().read())
            return result
        finally:
            connection.close()


def serve(script_path: Path | None, host: str, port: int) -> None:
    """Serve the scripted model in the foreground until interrupted."""
    script = Script.load(script_path) if script_path else None
    # Taken first, so that a port toolq cannot have is its one line, not uvicorn's log.
    listener = listen(host, port)
    config = _uvicorn_config(create_scripted_app(script), access_log=False)
    try:
        uvicorn.Server(config).run(sockets=[listener])
    finally:
        listener.close()
