"""One answer of the model as toolq keeps it: read from the JSON body of a chat completion, or
put together from the chunks of a streamed one.

An answer that arrived but cannot be used (a body that is not JSON, no choices, a stream that
ended before the model finished, fields of the wrong type) raises ``json.JSONDecodeError`` or
``UnusableAnswer``, which the model client retries.
"""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from typing import Any

from openai.types.chat import ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import ChoiceDeltaToolCall

from api.exceptions import UnusableAnswer


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


@dataclass(frozen=True)
class ModelToolCall:
    """A tool call as the model made it; ``arguments`` is the raw JSON string it sent."""

    id: str
    name: str
    arguments: str

    @classmethod
    def made(cls, id: str | None, name: str, arguments: str) -> ModelToolCall:
        """The call, with an id of its own when the provider sent none (some do not)."""
        return cls(id or f"call_{uuid.uuid4().hex}", name, arguments)

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
    tool_calls: list[ModelToolCall] = field(default_factory=list)
    finish_reason: str | None = None
    usage: Usage = field(default_factory=Usage)

    def assistant_message(self) -> dict[str, Any]:
        """The message to append to the conversation."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = [call.to_openai() for call in self.tool_calls]
        return message


def turn_from_body(body: bytes) -> ModelTurn:
    """The turn a non-streamed answer's body holds, read straight into toolq's types: the
    openai client's models of the same answer would be built only to be read once.
    ``json.JSONDecodeError`` when the body is not JSON, ``UnusableAnswer`` when it holds no
    usable turn."""
    try:
        completion = json.loads(body)
    except UnicodeDecodeError as exc:
        raise UnusableAnswer(f"the response body is not UTF-8 ({exc.reason})") from None
    if not isinstance(completion, dict):
        raise UnusableAnswer("the response is not a chat completion")
    choices = completion.get("choices")
    if not choices or not isinstance(choices, list):
        raise UnusableAnswer("the response has no choices")
    try:
        choice = choices[0]
        message = choice["message"]
        calls = [
            ModelToolCall.made(
                _text(call.get("id")),
                _text(call["function"]["name"]),
                _text(call["function"].get("arguments")),
            )
            for call in message.get("tool_calls") or []
            if call.get("type", "function") == "function"
        ]
        content = message.get("content")
        finish_reason = choice.get("finish_reason")
        if not (content is None or isinstance(content, str)) or not (
            finish_reason is None or isinstance(finish_reason, str)
        ):
            raise TypeError("content and finish_reason must be strings")
        return ModelTurn(content, calls, finish_reason, _usage(completion.get("usage")))
    except (AttributeError, KeyError, TypeError, ValueError) as exc:
        raise UnusableAnswer(
            f"the response is not a well-formed chat completion ({exc!r})"
        ) from exc


def _text(value: object) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise TypeError(f"expected a string, not {type(value).__name__}")
    return value


def _usage(usage: object) -> Usage:
    """Token counts as the provider gave them; one it left out counts 0."""
    if usage is None:
        return Usage()
    if not isinstance(usage, dict):
        raise TypeError("usage must be an object")
    counts = [
        usage.get(name) or 0 for name in ("prompt_tokens", "completion_tokens", "total_tokens")
    ]
    if not all(isinstance(count, int) for count in counts):
        raise TypeError("token counts must be integers")
    return Usage(*counts)


@dataclass
class _PartialCall:
    id: str = ""
    name: str = ""
    arguments: list[str] = field(default_factory=list)


class StreamAssembler:
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
            raise UnusableAnswer(f"a stream chunk is not well formed ({exc})") from exc

    def _add(self, chunk: ChatCompletionChunk) -> str:
        if (usage := chunk.usage) is not None:
            self._usage = Usage(usage.prompt_tokens, usage.completion_tokens, usage.total_tokens)
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
        """The whole turn; ``UnusableAnswer`` if the stream ended before the model finished."""
        if self._finish_reason is None:
            raise UnusableAnswer("the stream ended before the model finished its turn")
        calls = [
            ModelToolCall.made(partial.id, partial.name, "".join(partial.arguments))
            for _, partial in sorted(self._calls.items())
        ]
        return ModelTurn(
            content="".join(self._text) if self._saw_content else None,
            tool_calls=calls,
            finish_reason=self._finish_reason,
            usage=self._usage,
        )
