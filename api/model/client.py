"""The orchestrator's model client: one chat turn at a time.

The openai client retries a request that failed before its answer came: statuses 408, 409, 429
and 5xx (waiting as Retry-After or retry-after-ms asks, up to two minutes; a provider that asks
for longer is not retried), lost connections and timeouts, with its own exponential backoff.
What it cannot retry is an answer that broke after it began: a stream cut or stalled mid-way, a
body that is not JSON or not a usable chat completion. ``ChatModel`` asks those again itself,
announcing it on a stream with ``StreamRestarted``. Both kinds of retry draw on one budget,
``RetryPolicy.attempts`` requests a turn. Requests the provider refused (400, 401, 403, 404,
422, ...) are not retried. Every failure that reaches a caller is a ``ModelError``.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Self, TypeVar

import httpx2
import openai
from openai._base_client import get_platform
from openai.types.chat import ChatCompletion, ChatCompletionChunk

from api.exceptions import ModelError, UnusableAnswer
from api.model.body import EncodedBodies
from api.model.turn import ModelToolCall, ModelTurn, StreamAssembler, Usage, turn_from_body
from api.settings import (
    MODEL_URL_VARIABLE,
    OrchestratorSettings,
    get_settings,
    model_url_problem,
)
from worker.plumbing.backoff import Backoff

__all__ = [
    "ChatModel",
    "ModelError",
    "ModelToolCall",
    "ModelTurn",
    "RetryPolicy",
    "StreamEvent",
    "StreamRestarted",
    "StreamText",
    "TurnDone",
    "Usage",
    "model_client",
]

log = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/chat/completions"
#: What an answer that has arrived can still fail with: the connection cut or stalled
#: mid-stream, an error the provider reported inside the stream, a body that is not JSON, or
#: one that is not a usable completion.
_BROKEN_ANSWER = (openai.APIError, json.JSONDecodeError, UnusableAnswer)

_T = TypeVar("_T")


@dataclass(frozen=True)
class StreamText:
    """Text the model has generated so far in this turn."""

    text: str


@dataclass(frozen=True)
class StreamRestarted:
    """The turn broke mid-way and is asked again: drop the text received since it began."""

    reason: str
    attempt: int


@dataclass(frozen=True)
class TurnDone:
    turn: ModelTurn


StreamEvent = StreamText | StreamRestarted | TurnDone


@dataclass(frozen=True)
class RetryPolicy:
    """How many requests one turn may take, and how long to wait before asking again after an
    answer broke. The openai client's own retries count against ``attempts`` and wait as the
    client decides."""

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 8.0
    jitter: float = 0.25

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        Backoff(self.base_delay, self.max_delay, self.jitter)  # negative delays refused now

    @classmethod
    def from_settings(cls, settings: OrchestratorSettings) -> RetryPolicy:
        """``llm_max_retries`` counts retries, so one more attempt than that."""
        return cls(attempts=settings.llm_max_retries + 1)

    def delay(self, failures: int) -> float:
        """Seconds to wait after the ``failures``-th broken answer of a turn."""
        return Backoff(self.base_delay, self.max_delay, self.jitter).delay(failures)


#: Idle connections are dropped before common servers drop them (uvicorn, and so vLLM and
#: LiteLLM, after 5 s): reusing one the server is closing fails the request.
KEEPALIVE_S = 4.0
#: Headers the openai client adds to every request to describe its platform (its version, the
#: OS, the Python): sent for OpenAI's statistics, read by no server toolq talks to, and each one
#: more for the client to merge, check and copy on every request. Left out.
PLATFORM_HEADERS = (
    "X-Stainless-Lang",
    "X-Stainless-Package-Version",
    "X-Stainless-OS",
    "X-Stainless-Arch",
    "X-Stainless-Runtime",
    "X-Stainless-Runtime-Version",
    "X-Stainless-Async",
)
_WITHOUT_PLATFORM: Mapping[str, str | openai.Omit] = {
    name: openai.Omit() for name in PLATFORM_HEADERS
}


def model_client(
    *, base_url: str | None, api_key: str, timeout: float, max_retries: int
) -> openai.AsyncOpenAI:
    """An OpenAI client fit for thousands of conversations at once; ``max_retries`` is the
    retries a ``ChatModel`` on it allows each turn, unless given a ``RetryPolicy``."""
    limits = httpx2.Limits(
        max_connections=openai.DEFAULT_CONNECTION_LIMITS.max_connections,
        keepalive_expiry=KEEPALIVE_S,
    )
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url,
        timeout=timeout,
        max_retries=max_retries,
        # aiohttp's connection pool costs the same per request with a thousand connections open;
        # httpx's default pool walks all of them on every request and every response.
        http_client=openai.DefaultAioHttpClient(timeout=timeout, limits=limits),
    )


def model_api_from_env() -> tuple[str | None, str]:
    """OPENAI_BASE_URL (None: OpenAI's) and OPENAI_API_KEY; ``ModelError`` when neither is set."""
    base_url = os.environ.get(MODEL_URL_VARIABLE) or None
    # A URL that cannot be an API fails every attempt alike: refused before any is made.
    if base_url is not None and (problem := model_url_problem(base_url)):
        raise ModelError(problem)
    api_key = os.environ.get("OPENAI_API_KEY")
    if not api_key:
        if base_url is None:
            raise ModelError(
                "OPENAI_API_KEY is not set: set it, or point OPENAI_BASE_URL at a server "
                "that needs no key (for example `toolq scripted-llm`)"
            )
        api_key = "unused"  # local servers often want no key; the client insists on one
    return base_url, api_key


class ChatModel:
    """Chat turns against any OpenAI-compatible API, within ``policy``'s attempts (by default,
    one more than the client's ``max_retries``)."""

    def __init__(self, client: openai.AsyncOpenAI, policy: RetryPolicy | None = None) -> None:
        self._client = client
        self.policy = policy or RetryPolicy(attempts=client.max_retries + 1)
        self._bodies = EncodedBodies()
        # Given whole, the URL is parsed once per request rather than joined to the base URL
        # and parsed again.
        self._chat_url = f"{str(client.base_url).rstrip('/')}{CHAT_COMPLETIONS_PATH}"
        # The client finds its platform (for a header) in a thread on first use, once per request
        # still waiting for the first answer: a thousand conversations starting together would
        # fill asyncio's thread pool. Found once here instead; skipped if the client changes.
        if getattr(self._client, "_platform", "absent") is None:
            self._client._platform = get_platform()

    @classmethod
    def from_env(cls, settings: OrchestratorSettings | None = None) -> ChatModel:
        """A client for OPENAI_BASE_URL (default: OpenAI) with OPENAI_API_KEY."""
        settings = settings or get_settings()
        base_url, api_key = model_api_from_env()
        return cls(
            model_client(
                base_url=base_url,
                api_key=api_key,
                timeout=settings.llm_timeout_s,
                max_retries=settings.llm_max_retries,
            )
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> ModelTurn:
        """One turn, without streaming.

        The answer comes back as the client's raw HTTP response, whose body it has read (and
        retried, should the connection break) by then: its JSON is parsed once, into toolq's
        own types, where the client would build its models of it first.
        """
        body = self._bodies.body(model, messages, tools, stream=False)
        sent = broken = 0
        while True:
            response = await self._answer(
                self._client.post(
                    self._chat_url,
                    **body,
                    options=self._options(sent),
                    cast_to=httpx2.Response,
                ),
                sent,
            )
            sent += _requests_made(response.request)
            try:
                return turn_from_body(await response.aread())
            except _BROKEN_ANSWER as exc:
                broken += 1
                self._ask_again_or_raise(exc, sent)
            await asyncio.sleep(self.policy.delay(broken))

    async def stream(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """One turn as it is generated: ``StreamText``s, then ``TurnDone``.

        An answer that breaks mid-way is announced with ``StreamRestarted`` before the turn is
        asked again.
        """
        body = self._bodies.body(model, messages, tools, stream=True)
        sent = broken = 0
        while True:
            chunks = await self._answer(
                self._client.post(
                    self._chat_url,
                    **body,
                    options=self._options(sent),
                    cast_to=ChatCompletion,
                    stream=True,
                    stream_cls=openai.AsyncStream[ChatCompletionChunk],
                ),
                sent,
            )
            sent += _requests_made(chunks.response.request)
            try:
                async with chunks:
                    assembler = StreamAssembler()
                    async for chunk in chunks:
                        if text := assembler.add(chunk):
                            yield StreamText(text)
                turn = assembler.finish()
            except _BROKEN_ANSWER as exc:
                broken += 1
                reason = self._ask_again_or_raise(exc, sent)
            else:
                yield TurnDone(turn)
                return
            yield StreamRestarted(reason, sent + 1)
            await asyncio.sleep(self.policy.delay(broken))

    def _options(self, sent: int) -> openai.RequestOptions:
        """What the request needs besides its body: the API key as a bearer token (without it
        the client sends no Authorization header), the retries the turn has left, and no
        platform headers."""
        return {
            "security": {"bearer_auth": True},
            "max_retries": self.policy.attempts - sent - 1,
            "headers": _WITHOUT_PLATFORM,
        }

    async def _answer(self, request: Awaitable[_T], sent: int) -> _T:
        """What ``request`` returns once the client has done its retrying; its last failure is
        raised as ``ModelError``."""
        try:
            return await request
        except openai.APIError as exc:
            sent += _requests_made(exc.request)
            status = exc.status_code if isinstance(exc, openai.APIStatusError) else None
            if sent < self.policy.attempts:  # the client would not retry it
                raise ModelError(
                    f"model request refused, not retried: {_describe(exc)}",
                    attempts=sent,
                    status=status,
                ) from exc
            raise _gave_up(exc, sent, status) from exc

    def _ask_again_or_raise(self, exc: Exception, sent: int) -> str:
        """Why the answer broke, when the turn has attempts left; else ``ModelError``."""
        if sent >= self.policy.attempts:
            raise _gave_up(exc, sent, None) from exc
        reason = _describe(exc)
        log.warning("model answer broke (attempt %d): %s; asking again", sent, reason)
        return reason


def _requests_made(request: httpx2.Request) -> int:
    """The requests the client has sent up to and including ``request``: it numbers its retries
    in a header of each."""
    return int(request.headers.get("x-stainless-retry-count") or 0) + 1


def _gave_up(exc: Exception, attempts: int, status: int | None) -> ModelError:
    last_status = f" (last status {status})" if status else ""
    return ModelError(
        f"model request failed after {attempts} attempt{'' if attempts == 1 else 's'}"
        f"{last_status}: {_describe(exc)}",
        attempts=attempts,
        status=status,
    )


def _describe(exc: Exception) -> str:
    if isinstance(exc, openai.APIStatusError):
        return exc.message
    cause = exc.__cause__
    if isinstance(exc, openai.APIError) and (failed := _connect_failure(exc)):
        return failed
    if isinstance(exc, openai.APITimeoutError):
        # Transports file some lost connections under timeouts ("Server disconnected").
        detail = f" ({type(cause).__name__}: {cause})" if cause and str(cause) else ""
        return f"the request timed out{detail}"
    if isinstance(exc, openai.APIConnectionError):
        detail = f": {type(cause).__name__}: {cause}" if cause else ""
        return f"the connection failed{detail}"
    if isinstance(exc, json.JSONDecodeError):
        return f"the response body is not JSON ({exc.msg})"
    # UnusableAnswer, or an error the provider reported inside a stream.
    return str(exc)


def _connect_failure(exc: openai.APIError) -> str | None:
    """A connection that could not be opened, said as what it was. The aiohttp transport
    reports a refused connection or an unknown host as a connect *timeout*, which would send
    the user looking for a slow server rather than a stopped one or a misspelt name."""
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionRefusedError):
            return f"the connection was refused ({_transport_message(exc)})"
        if isinstance(cause, socket.gaierror):
            return f"the host name could not be resolved ({_transport_message(exc)})"
        cause = cause.__cause__ or cause.__context__
    return None


def _transport_message(exc: BaseException) -> str:
    """The transport's own words, which name the host and port: "Cannot connect to host ..."."""
    return str(exc.__cause__ or exc)
