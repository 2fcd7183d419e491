"""A local OpenAI-compatible chat server that replays scripted answers.

It stands in for a real model in tests, in ``toolq demo`` and in benchmarks. A script is a list of
steps; the step played is the number of assistant messages already in the request, so the server
keeps no conversation state and any number of conversations can share it.

A step's strings may contain two placeholders, replaced by plain text substitution (no other
braces are touched): ``{prompt}``, the last user message, and ``{last_tool_result}``, the last
tool message (empty when there is none). When the steps run out, the last step that has only
``content`` is played again, or "Done." when there is none.

A step may carry a ``fault``, played ``times`` times per conversation before the step's normal
answer; attempts are counted per distinct list of messages, which is what a retry resends.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.client
import json
import socket
import threading
import time
import uuid
from collections import Counter
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Annotated, Any, Literal, Self

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from starlette.types import Receive, Scope, Send

SHIPPED_SCRIPTS_DIR = Path(__file__).parent / "scripts"
DEFAULT_SCRIPT_PATH = SHIPPED_SCRIPTS_DIR / "demo.json"
MODEL_PREFIX = "scripted:"
DEFAULT_MODEL = "scripted"

# Small pieces so that clients really have to reassemble text and tool-call arguments.
CONTENT_PIECE_CHARS = 16
ARGUMENTS_PIECE_CHARS = 8


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _FaultBase(_Strict):
    times: int = Field(1, ge=1, description="Failed attempts per conversation before the answer.")


class StatusFault(_FaultBase):
    """Answer with an HTTP error status."""

    kind: Literal["status"]
    status: int = Field(500, ge=400, le=599)
    retry_after: float | None = Field(None, ge=0, description="Seconds, sent as Retry-After.")


class GarbageFault(_FaultBase):
    """Answer 200 with a body that is not JSON."""

    kind: Literal["garbage"]


class CutFault(_FaultBase):
    """Send part of the answer, then close the connection."""

    kind: Literal["cut"]


class StallFault(_FaultBase):
    """Wait before answering, to run past a client's timeout."""

    kind: Literal["stall"]
    seconds: float = Field(gt=0)


Fault = Annotated[StatusFault | GarbageFault | CutFault | StallFault, Field(discriminator="kind")]


class ScriptedToolCall(_Strict):
    """A tool call the scripted model makes."""

    name: str = Field(min_length=1)
    arguments: dict[str, Any] | str = Field(
        default_factory=dict, description="An object, or a raw string sent as is (may be bad JSON)."
    )
    id: str | None = Field(None, description="Generated when absent; '' sends an empty id.")


class Step(_Strict):
    """One assistant turn: text, tool calls, or both; optionally preceded by failures."""

    content: str | None = None
    tool_calls: list[ScriptedToolCall] = Field(default_factory=list)
    fault: Fault | None = None

    @model_validator(mode="after")
    def _says_something(self) -> Self:
        if self.content is None and not self.tool_calls:
            raise ValueError("a step needs 'content', 'tool_calls' or both")
        return self


class Script(_Strict):
    """The answers a scripted model gives, in order."""

    description: str = ""
    steps: list[Step] = Field(min_length=1)

    @classmethod
    def load(cls, path: Path) -> Script:
        """Read a script file; a bad file raises ``ValueError`` naming it and the problem."""
        try:
            return cls.model_validate_json(Path(path).read_bytes())
        except ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(map(str, error['loc'])) or 'script'}: {error['msg']}"
                for error in exc.errors()
            )
            raise ValueError(f"invalid script {path}: {problems}") from exc
        except OSError as exc:
            raise ValueError(f"cannot read script {path}: {exc.strerror or exc}") from exc

    @classmethod
    def from_steps(cls, steps: Sequence[Step | Mapping[str, Any]]) -> Script:
        return cls.model_validate({"steps": steps})

    def step_for(self, assistant_turns: int) -> Step:
        """The step to play after ``assistant_turns`` answers; past the end, a closing answer."""
        if assistant_turns < len(self.steps):
            return self.steps[assistant_turns]
        for step in reversed(self.steps):
            if step.content is not None and not step.tool_calls:
                return Step(content=step.content)
        return Step(content="Done.")


# --- Rendering a step into an answer -------------------------------------------------------------


@dataclass(frozen=True)
class _ToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class _Answer:
    content: str | None
    tool_calls: list[_ToolCall]

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    @property
    def completion_tokens(self) -> int:
        text = (self.content or "") + "".join(c.name + c.arguments for c in self.tool_calls)
        return _rough_tokens(text)


def _rough_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def _message_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: keep the text ones
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def _last_text(messages: list[dict[str, Any]], role: str) -> str:
    for message in reversed(messages):
        if message.get("role") == role:
            return _message_text(message)
    return ""


def _substitute(value: Any, variables: dict[str, str]) -> Any:
    if isinstance(value, str):
        for name, replacement in variables.items():
            value = value.replace(name, replacement)
        return value
    if isinstance(value, dict):
        return {key: _substitute(item, variables) for key, item in value.items()}
    if isinstance(value, list):
        return [_substitute(item, variables) for item in value]
    return value


def _render(step: Step, messages: list[dict[str, Any]]) -> _Answer:
    variables = {
        "{prompt}": _last_text(messages, "user"),
        "{last_tool_result}": _last_text(messages, "tool"),
    }
    calls = []
    for call in step.tool_calls:
        arguments = _substitute(call.arguments, variables)
        calls.append(
            _ToolCall(
                id=f"call_{uuid.uuid4().hex[:24]}" if call.id is None else call.id,
                name=call.name,
                arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
            )
        )
    content = None if step.content is None else _substitute(step.content, variables)
    return _Answer(content=content, tool_calls=calls)


# --- Wire format ---------------------------------------------------------------------------------


def _completion(answer: _Answer, model: str, prompt_tokens: int) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": answer.content, "refusal": None}
    if answer.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": call.arguments},
            }
            for call in answer.tool_calls
        ]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
        "choices": [
            {
                "index": 0,
                "message": message,
                "logprobs": None,
                "finish_reason": answer.finish_reason,
            }
        ],
        "usage": _usage(prompt_tokens, answer.completion_tokens),
    }


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _chunk_deltas(answer: _Answer) -> Iterator[tuple[dict[str, Any], str | None]]:
    """(delta, finish_reason) pairs in the order OpenAI streams them."""
    if answer.content is not None or not answer.tool_calls:
        yield {"role": "assistant", "content": "", "refusal": None}, None
        for piece in _pieces(answer.content or "", CONTENT_PIECE_CHARS):
            yield {"content": piece}, None
    for index, call in enumerate(answer.tool_calls):
        head = {
            "index": index,
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": ""},
        }
        if index == 0 and answer.content is None:
            yield {"role": "assistant", "content": None, "tool_calls": [head]}, None
        else:
            yield {"tool_calls": [head]}, None
        for piece in _pieces(call.arguments, ARGUMENTS_PIECE_CHARS):
            yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None
    yield {}, answer.finish_reason


def _sse_events(
    answer: _Answer, model: str, prompt_tokens: int, include_usage: bool
) -> list[bytes]:
    base: dict[str, Any] = {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": None,
    }
    if include_usage:
        base["usage"] = None
    events = []
    for delta, finish_reason in _chunk_deltas(answer):
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
        events.append(_sse({**base, "choices": [choice]}))
    if include_usage:
        usage = _usage(prompt_tokens, answer.completion_tokens)
        events.append(_sse({**base, "choices": [], "usage": usage}))
    events.append(b"data: [DONE]\n\n")
    return events


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


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


@dataclass(frozen=True)
class _ChatRequest:
    """The parts of a chat completion request the scripted model looks at."""

    model: str
    messages: list[dict[str, Any]]
    stream: bool
    include_usage: bool

    @classmethod
    def parse(cls, raw: bytes) -> _ChatRequest:
        """Raises ``ValueError`` with a message for the client when the request is unusable."""
        try:
            body = json.loads(raw)
        except ValueError:
            raise ValueError("the request body is not valid JSON") from None
        if not isinstance(body, dict):
            raise ValueError("the request body must be a JSON object")
        messages = body.get("messages")
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("'messages' must be a list of message objects")
        model = body.get("model")
        if not isinstance(model, str) or not model:
            raise ValueError("'model' must be a non-empty string")
        options = body.get("stream_options")
        return cls(
            model=model,
            messages=messages,
            stream=body.get("stream") is True,
            include_usage=isinstance(options, dict) and options.get("include_usage") is True,
        )


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
            chat = _ChatRequest.parse(await request.body())
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
        answer = _render(step, chat.messages)
        prompt_tokens = sum(_rough_tokens(_message_text(m)) + 3 for m in chat.messages)
        if chat.stream:
            body = _sse_events(answer, chat.model, prompt_tokens, chat.include_usage)
        else:
            body = [json.dumps(_completion(answer, chat.model, prompt_tokens)).encode()]

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

    def _should_fail(self, chat: _ChatRequest, times: int) -> bool:
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


def _load_scripts(directory: Path) -> dict[str, Script]:
    return {path.stem: Script.load(path) for path in sorted(directory.glob("*.json"))}


def create_app(script: Script | None = None, scripts_dir: Path | None = None) -> FastAPI:
    """The scripted model's app.

    ``script`` answers every model name not of the form ``scripted:<name>`` (default: the shipped
    demo); ``scripted:<name>`` picks ``<name>.json`` from ``scripts_dir`` (default: the shipped
    scripts).
    """
    scripts = _load_scripts(scripts_dir or SHIPPED_SCRIPTS_DIR)
    model = _ScriptedModel(script or Script.load(DEFAULT_SCRIPT_PATH), scripts)
    app = FastAPI(title="toolq scripted model", docs_url=None, redoc_url=None)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await model.answer(request)

    @app.get("/v1/models")
    async def list_models() -> dict[str, Any]:
        data = [
            {"id": name, "object": "model", "created": 0, "owned_by": "toolq"}
            for name in model.model_names()
        ]
        return {"object": "list", "data": data}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return model.stats.as_dict()

    return app


# --- Running it ----------------------------------------------------------------------------------


def _uvicorn_config(app: FastAPI, **options: Any) -> uvicorn.Config:
    return uvicorn.Config(
        app,
        lifespan="off",
        ws="none",
        backlog=4096,
        timeout_graceful_shutdown=1,
        **options,
    )


class ScriptedServer:
    """The scripted model on 127.0.0.1 and a free port, served from a background thread."""

    def __init__(
        self,
        script: Script | None = None,
        *,
        scripts_dir: Path | None = None,
        startup_timeout_s: float = 10.0,
    ) -> None:
        self._app = create_app(script, scripts_dir)
        self._startup_timeout_s = startup_timeout_s
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
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", 0))
        self._socket = sock
        self.port = sock.getsockname()[1]
        server = uvicorn.Server(_uvicorn_config(self._app, log_level="warning", access_log=False))
        self._server = server
        self._thread = threading.Thread(
            target=server.run, kwargs={"sockets": [sock]}, name="scripted-llm", daemon=True
        )
        self._thread.start()
        deadline = time.monotonic() + self._startup_timeout_s
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

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


def serve(script_path: Path | None, host: str, port: int) -> None:
    """Serve the scripted model in the foreground until interrupted."""
    script = Script.load(script_path) if script_path else None
    config = _uvicorn_config(create_app(script), host=host, port=port, access_log=False)
    uvicorn.Server(config).run()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m api.scripted", description="Serve a scripted OpenAI-compatible model."
    )
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8900)
    parser.add_argument("--script", type=Path, help="default script (default: the shipped demo)")
    args = parser.parse_args(argv)
    try:
        serve(args.script, args.host, args.port)
    except ValueError as exc:
        parser.exit(2, f"error: {exc}\n")


if __name__ == "__main__":
    main()
