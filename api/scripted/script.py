"""What the scripted model says: scripts of steps, their faults, and the answer a step gives,
written as the chat completions API writes it (whole, or as a stream of small pieces).

A script is a list of steps; the step played is the number of assistant messages already in the
request, so the server keeps no conversation state and any number of conversations can share it.

A step's strings may contain two placeholders, replaced by plain text substitution (no other
braces are touched): ``{prompt}``, the last user message, and ``{last_tool_result}``, the last
tool message (empty when there is none). When the steps run out, the last step that has only
``content`` is played again, or "Done." when there is none.

A step may carry a ``fault``, played ``times`` times per conversation before the step's normal
answer; attempts are counted per distinct list of messages, which is what a retry resends.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

SHIPPED_SCRIPTS_DIR = Path(__file__).parent / "scripts"
DEFAULT_SCRIPT_PATH = SHIPPED_SCRIPTS_DIR / "demo.json"

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

    def answer(self, messages: list[dict[str, Any]]) -> Answer:
        """What this step says to a conversation, its placeholders filled from ``messages``."""
        variables = {
            "{prompt}": _last_text(messages, "user"),
            "{last_tool_result}": _last_text(messages, "tool"),
        }
        calls = []
        for call in self.tool_calls:
            arguments = _substitute(call.arguments, variables)
            calls.append(
                AnswerToolCall(
                    id=f"call_{uuid.uuid4().hex[:24]}" if call.id is None else call.id,
                    name=call.name,
                    arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                )
            )
        content = None if self.content is None else _substitute(self.content, variables)
        return Answer(content=content, tool_calls=calls)


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
            raise ValueError(f"invalid script {path}: {problems(exc, 'script')}") from exc
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


def load_scripts(directory: Path) -> dict[str, Script]:
    """Every ``<name>.json`` of ``directory``, by name."""
    return {path.stem: Script.load(path) for path in sorted(directory.glob("*.json"))}


def problems(exc: ValidationError, whole: str) -> str:
    """A validation error as one line: where (``whole`` for the top level) and what."""
    return "; ".join(
        f"{_where(error['loc']) or whole}: {error['msg']}"
        for error in exc.errors(include_url=False)
    )


def _where(location: tuple[int | str, ...]) -> str:
    return f"'{'.'.join(map(str, location))}'" if location else ""


@dataclass(frozen=True)
class AnswerToolCall:
    id: str
    name: str
    arguments: str


@dataclass(frozen=True)
class Answer:
    """One step's answer to one conversation, before it is written as JSON or as a stream."""

    content: str | None
    tool_calls: list[AnswerToolCall]

    @property
    def finish_reason(self) -> str:
        return "tool_calls" if self.tool_calls else "stop"

    @property
    def completion_tokens(self) -> int:
        text = (self.content or "") + "".join(c.name + c.arguments for c in self.tool_calls)
        return rough_tokens(text)

    def completion(self, model: str, prompt_tokens: int) -> dict[str, Any]:
        """The answer as a chat completion."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content, "refusal": None}
        if self.tool_calls:
            message["tool_calls"] = [
                {
                    "id": call.id,
                    "type": "function",
                    "function": {"name": call.name, "arguments": call.arguments},
                }
                for call in self.tool_calls
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
                    "finish_reason": self.finish_reason,
                }
            ],
            "usage": _usage(prompt_tokens, self.completion_tokens),
        }

    def sse_events(self, model: str, prompt_tokens: int, include_usage: bool) -> list[bytes]:
        """The answer as the server-sent events of a streamed chat completion."""
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
        for delta, finish_reason in self._chunk_deltas():
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
            events.append(_sse({**base, "choices": [choice]}))
        if include_usage:
            usage = _usage(prompt_tokens, self.completion_tokens)
            events.append(_sse({**base, "choices": [], "usage": usage}))
        events.append(b"data: [DONE]\n\n")
        return events

    def _chunk_deltas(self) -> Iterator[tuple[dict[str, Any], str | None]]:
        """(delta, finish_reason) pairs in the order OpenAI streams them."""
        if self.content is not None or not self.tool_calls:
            yield {"role": "assistant", "content": "", "refusal": None}, None
            for piece in _pieces(self.content or "", CONTENT_PIECE_CHARS):
                yield {"content": piece}, None
        for index, call in enumerate(self.tool_calls):
            head = {
                "index": index,
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": ""},
            }
            if index == 0 and self.content is None:
                yield {"role": "assistant", "content": None, "tool_calls": [head]}, None
            else:
                yield {"tool_calls": [head]}, None
            for piece in _pieces(call.arguments, ARGUMENTS_PIECE_CHARS):
                yield {"tool_calls": [{"index": index, "function": {"arguments": piece}}]}, None
        yield {}, self.finish_reason


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def _pieces(text: str, size: int) -> Iterator[str]:
    for start in range(0, len(text), size):
        yield text[start : start + size]


def _sse(payload: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"


def rough_tokens(text: str) -> int:
    return max(1, len(text) // 4)


def count_prompt_tokens(messages: list[dict[str, Any]]) -> int:
    return sum(rough_tokens(_message_text(message)) + 3 for message in messages)


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
