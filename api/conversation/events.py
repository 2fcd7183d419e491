"""What a running conversation reports as it goes: for terminals, SSE clients and logs."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, Literal

#: Why a conversation ended: the model answered, or a turn, time or token limit stopped it.
StopReason = Literal["answered", "max_turns", "time_limit", "token_limit"]


@dataclass(frozen=True, slots=True)
class TextDelta:
    text: str
    type: Literal["text_delta"] = "text_delta"


@dataclass(frozen=True, slots=True)
class TextDiscarded:
    """The model's stream broke and the turn is replayed: drop the text shown for it."""

    reason: str
    type: Literal["text_discarded"] = "text_discarded"


@dataclass(frozen=True, slots=True)
class ToolCallStarted:
    id: str
    name: str
    arguments: str
    type: Literal["tool_call_started"] = "tool_call_started"


@dataclass(frozen=True, slots=True)
class ToolCallFinished:
    id: str
    name: str
    output: str
    is_error: bool
    error_kind: str | None
    duration_ms: float
    worker: str | None
    #: The pool that ran the call (None: the orchestrator itself).
    pool: str | None = None
    #: What the call's command used (run_bash): ``worker.contract.wire.ResourceUsage`` as a dict.
    usage: dict[str, Any] | None = None
    truncated: bool = False
    type: Literal["tool_call_finished"] = "tool_call_finished"


@dataclass(frozen=True, slots=True)
class FinalAnswer:
    text: str
    stop_reason: StopReason
    type: Literal["final_answer"] = "final_answer"


AgentEvent = TextDelta | TextDiscarded | ToolCallStarted | ToolCallFinished | FinalAnswer


def event_to_dict(event: AgentEvent) -> dict[str, Any]:
    return asdict(event)
