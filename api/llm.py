"""The orchestrator's model client: one chat turn at a time, with our own retry policy.

Every failure that reaches a caller is a ``ModelError``. Rate limits, server errors, timeouts,
lost connections, cut streams and bodies that are not JSON are retried with backoff; requests
the provider refused (400, 401, 403, 404, 422, ...) are not.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import random
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from typing import Any, Self

import httpx2
import openai
from openai._base_client import get_platform
from openai.types import CompletionUsage
from openai.types.chat import (
    ChatCompletion,
    ChatCompletionChunk,
)
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from api.settings import OrchestratorSettings, get_settings

log = logging.getLogger(__name__)

CHAT_COMPLETIONS_PATH = "/chat/completions"
#: What ``chat.completions.create`` asks of the client besides the body: the API key as a bearer
#: token (without it the client sends no Authorization header).
_REQUEST_OPTIONS: openai.RequestOptions = {"security": {"bearer_auth": True}}

#: Statuses worth another try; every other 4xx means the request itself is wrong.
RETRYABLE_4XX = frozenset({408, 409, 429})


class ModelError(Exception):
    """A model request failed for good: refused, or still failing after the last attempt."""

    def __init__(self, message: str, *, attempts: int = 0, status: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status = status


@dataclass(frozen=True)
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.prompt_tokens + other.prompt_tokens,
            self.completion_tokens + other.completion_tokens,
            self.total_tokens + other.total_tokens,
        )

    @classmethod
    def from_openai(cls, usage: CompletionUsage | None) -> Usage:
        if usage is None:
            return cls()
        return cls(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)


@dataclass(frozen=True)
class ToolCallSpec:
    """A tool call as the model made it; ``arguments`` is the raw JSON string it sent."""

    id: str
    name: str
    arguments: str

    def to_openai(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        }


@dataclass(frozen=True)
class ModelTurn:
    """One complete answer of the model."""

    content: str | None
    tool_calls: list[ToolCallSpec] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def assistant_message(self) -> dict[str, Any]:
        """The message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


@dataclass(frozen=True)
class TextDelta:
    text: str


@dataclass(frozen=True)
class StreamRestarted:
    """The turn failed mid-way and is asked again: drop the text received since it began."""

    reason: str
    attempt: int


@dataclass(frozen=True)
class TurnDone:
    turn: ModelTurn


StreamEvent = TextDelta | StreamRestarted | TurnDone


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently a failed request is tried again."""

    attempts: int = 5
    base_delay: float = 0.5
    max_delay: float = 8.0
    #: Up to this fraction is added to each delay at random, so that many conversations that
    #: failed together do not all come back at the same instant.
    jitter: float = 0.25
    #: The longest wait a provider's Retry-After can ask for.
    max_retry_after: float = 60.0

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError("RetryPolicy.attempts must be at least 1")
        if min(self.base_delay, self.max_delay, self.jitter, self.max_retry_after) < 0:
            raise ValueError("RetryPolicy delays and jitter cannot be negative")

    @classmethod
    def from_settings(cls, settings: OrchestratorSettings) -> RetryPolicy:
        """``llm_max_retries`` counts retries, so one more attempt than that."""
        return cls(attempts=settings.llm_max_retries + 1)

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        """Seconds to wait after the ``failures``-th failed attempt."""
        if retry_after is not None:
            return min(retry_after, self.max_retry_after)
        backoff = min(self.max_delay, self.base_delay * 2.0 ** (failures - 1))
        return backoff * (1 + self.jitter * random.random())


class _BadResponse(Exception):
    """The provider answered 200 with something that is not a usable chat completion."""


@dataclass(frozen=True)
class _Failure:
    reason: str
    retryable: bool
    status: int | None = None
    retry_after: float | None = None


# What a single attempt can fail with; anything else is a bug and propagates as is.
_ATTEMPT_ERRORS = (openai.APIError, json.JSONDecodeError, _BadResponse)


def _failure_of(exc: Exception) -> _Failure:
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        retryable = status in RETRYABLE_4XX or status >= 500
        return _Failure(exc.message, retryable, status, _retry_after_s(exc.response.headers))
    if isinstance(exc, openai.APITimeoutError):
        # Transports file some lost connections under timeouts ("Server disconnected").
        cause = exc.__cause__
        detail = f" ({type(cause).__name__}: {cause})" if cause and str(cause) else ""
        return _Failure(f"the request timed out{detail}", True)
    if isinstance(exc, openai.APIConnectionError):
        cause = exc.__cause__
        detail = f": {type(cause).__name__}: {cause}" if cause else ""
        return _Failure(f"the connection failed{detail}", True)
    if isinstance(exc, json.JSONDecodeError):
        return _Failure(f"the response body is not JSON ({exc.msg})", True)
    # _BadResponse, or an error the provider reported inside a stream.
    return _Failure(str(exc), True)


def _retry_after_s(headers: Mapping[str, str]) -> float | None:
    """The wait a response asks for: OpenAI's retry-after-ms, or Retry-After (seconds or date)."""
    try:
        if milliseconds := headers.get("retry-after-ms"):
            return max(0.0, float(milliseconds) / 1000)
        if value := headers.get("retry-after"):
            try:
                return max(0.0, float(value))
            except ValueError:
                when = parsedate_to_datetime(value)
                return max(0.0, (when - datetime.now(UTC)).total_seconds())
    except (ValueError, TypeError):
        log.debug("unreadable Retry-After header ignored")
    return None


#: Idle connections are dropped before common servers drop them (uvicorn, and so vLLM and
#: LiteLLM, after 5 s): reusing one the server is closing fails the request.
KEEPALIVE_S = 4.0


def model_client(*, base_url: str | None, api_key: str, timeout: float) -> openai.AsyncOpenAI:
    """An OpenAI client fit for thousands of conversations at once."""
    limits = httpx2.Limits(
        max_connections=openai.DEFAULT_CONNECTION_LIMITS.max_connections,
        keepalive_expiry=KEEPALIVE_S,
    )
    return openai.AsyncOpenAI(
        api_key=api_key,
        base_url=base_url,
        timeout=timeout,
        max_retries=0,
        # aiohttp's connection pool costs the same per request with a thousand connections open;
        # httpx's default pool walks all of them on every request and every response.
        http_client=openai.DefaultAioHttpClient(timeout=timeout, limits=limits),
    )


class ChatModel:
    """Chat turns against any OpenAI-compatible API, retried by ``policy``."""

    def __init__(self, client: openai.AsyncOpenAI, policy: RetryPolicy | None = None) -> None:
        # The client's own retries would multiply ours and ignore our backoff.
        self._client = client if client.max_retries == 0 else client.with_options(max_retries=0)
        self.policy = policy or RetryPolicy()
        # The client finds its platform (for a header) in a thread on first use, once per request
        # still waiting for the first answer: a thousand conversations starting together would
        # fill asyncio's thread pool. Found once here instead; skipped if the client changes.
        if getattr(self._client, "_platform", "absent") is None:
            self._client._platform = get_platform()

    @classmethod
    def from_env(cls, settings: OrchestratorSettings | None = None) -> ChatModel:
        """A client for OPENAI_BASE_URL (default: OpenAI) with OPENAI_API_KEY."""
        settings = settings or get_settings()
        base_url = os.environ.get("OPENAI_BASE_URL") or None
        api_key = os.environ.get("OPENAI_API_KEY")
        if not api_key:
            if base_url is None:
                raise ModelError(
                    "OPENAI_API_KEY is not set: set it, or point OPENAI_BASE_URL at a server "
                    "that needs no key (for example `toolq scripted-llm`)"
                )
            api_key = "unused"  # local servers often want no key; the client insists on one
        client = model_client(base_url=base_url, api_key=api_key, timeout=settings.llm_timeout_s)
        return cls(client, RetryPolicy.from_settings(settings))

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
        """One turn, without streaming."""
        for attempt in range(1, self.policy.attempts + 1):
            try:
                completion = await self._client.post(
                    CHAT_COMPLETIONS_PATH,
                    body=chat_body(model, messages, tools, stream=False),
                    options=_REQUEST_OPTIONS,
                    cast_to=ChatCompletion,
                )
                return _turn_from_completion(completion)
            except _ATTEMPT_ERRORS as exc:
                failure = self._give_up_or_log(exc, attempt)
            await asyncio.sleep(self.policy.delay(attempt, failure.retry_after))
        raise AssertionError("unreachable: the last attempt raises")

    async def stream(
        self,
        *,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
    ) -> AsyncIterator[StreamEvent]:
        """One turn as it is generated: ``TextDelta``s, then ``TurnDone``.

        A failed attempt is announced with ``StreamRestarted`` before the turn is asked again.
        """
        for attempt in range(1, self.policy.attempts + 1):
            try:
                chunks = await self._client.post(
                    CHAT_COMPLETIONS_PATH,
                    body=chat_body(model, messages, tools, stream=True),
                    options=_REQUEST_OPTIONS,
                    cast_to=ChatCompletion,
                    stream=True,
                    stream_cls=openai.AsyncStream[ChatCompletionChunk],
                )
                async with chunks:
                    assembler = _StreamAssembler()
                    async for chunk in chunks:
                        if text := assembler.add(chunk):
                            yield TextDelta(text)
                turn = assembler.finish()
            except _ATTEMPT_ERRORS as exc:
                failure = self._give_up_or_log(exc, attempt)
            else:
                yield TurnDone(turn)
                return
            yield StreamRestarted(failure.reason, attempt + 1)
            await asyncio.sleep(self.policy.delay(attempt, failure.retry_after))

    def _give_up_or_log(self, exc: Exception, attempt: int) -> _Failure:
        """The failure to retry after; raises ``ModelError`` when there is no retry."""
        failure = _failure_of(exc)
        if not failure.retryable:
            raise ModelError(
                f"model request refused, not retried: {failure.reason}",
                attempts=attempt,
                status=failure.status,
            ) from exc
        if attempt >= self.policy.attempts:
            status = f" (last status {failure.status})" if failure.status else ""
            raise ModelError(
                f"model request failed after {attempt} attempts{status}: {failure.reason}",
                attempts=attempt,
                status=failure.status,
            ) from exc
        log.warning("model request failed (attempt %d): %s; retrying", attempt, failure.reason)
        return failure


def chat_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    stream: bool,
) -> dict[str, Any]:
    """The JSON body ``chat.completions.create`` would send for these arguments.

    Messages and tool schemas are already wire-format dicts; ``create`` would walk every one of
    them, every turn, through its type-driven transform, which cost more CPU than the rest of
    the request once conversations grow.
    """
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    if tools:  # providers reject an empty list, so no tools means no parameter
        body["tools"] = list(tools)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex}"


def _turn_from_completion(completion: object) -> ModelTurn:
    # Without strict validation the client hands back text, or a half-filled model, for odd bodies.
    if not isinstance(completion, ChatCompletion):
        raise _BadResponse("the response is not a chat completion")
    try:
        if not completion.choices:
            raise _BadResponse("the response has no choices")
        choice = completion.choices[0]
        calls = [
            ToolCallSpec(
                id=call.id or _new_call_id(),
                name=call.function.name,
                arguments=call.function.arguments or "",
            )
            for call in choice.message.tool_calls or []
            if call.type == "function"
        ]
        return ModelTurn(
            content=choice.message.content,
            tool_calls=calls,
            finish_reason=choice.finish_reason,
            usage=Usage.from_openai(completion.usage),
        )
    except (AttributeError, TypeError) as exc:
        raise _BadResponse(f"the response is not a well-formed chat completion ({exc})") from exc


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class _StreamAssembler:
    """Builds a ModelTurn from chunks: text concatenated, tool calls gathered by index."""

    def __init__(self) -> None:
        self._text: list[str] = []
        self._saw_content = False
        self._calls: dict[int, _PartialCall] = {}
        self._finish_reason: str | None = None
        self._usage = Usage()

    def add(self, chunk: ChatCompletionChunk) -> str:
        """Take one chunk; returns the text it adds."""
        try:
            return self._add(chunk)
        except (AttributeError, TypeError) as exc:
            raise _BadResponse(f"a stream chunk is not well formed ({exc})") from exc

    def _add(self, chunk: ChatCompletionChunk) -> str:
        if chunk.usage is not None:
            self._usage = Usage.from_openai(chunk.usage)
        text = ""
        for choice in chunk.choices:
            delta = choice.delta
            if delta.content is not None:
                self._saw_content = True
                text += delta.content
            for call in delta.tool_calls or []:
                self._add_call(call)
            if choice.finish_reason is not None:
                self._finish_reason = choice.finish_reason
        if text:
            self._text.append(text)
        return text

    def _add_call(self, delta: ChoiceDeltaToolCall) -> None:
        index = delta.index
        if index is None:  # some providers omit it: a new id starts a new call
            known = {partial.id for partial in self._calls.values()}
            new = bool(delta.id) and delta.id not in known
            index = len(self._calls) if new or not self._calls else max(self._calls)
        partial = self._calls.setdefault(index, _PartialCall())
        if delta.id and not partial.id:
            partial.id = delta.id
        if delta.function is not None:
            if delta.function.name and not partial.name:
                partial.name = delta.function.name
            if delta.function.arguments:
                partial.arguments.append(delta.function.arguments)

    def finish(self) -> ModelTurn:
        if self._finish_reason is None:
            raise _BadResponse("the stream ended before the model finished its turn")
        calls = [
            ToolCallSpec(
                id=partial.id or _new_call_id(),
                name=partial.name,
                arguments="".join(partial.arguments),
            )
            for _, partial in sorted(self._calls.items())
        ]
        return ModelTurn(
            content="".join(self._text) if self._saw_content else None,
            tool_calls=calls,
            finish_reason=self._finish_reason,
            usage=self._usage,
        )
