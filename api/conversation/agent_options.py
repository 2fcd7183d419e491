"""How a conversation runs (``AgentOptions``) and what it records of each tool call."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from pydantic import ConfigDict, Field

from api.conversation.events import ToolCallFinished
from api.images.fields import ImageFields
from api.model.client import ModelToolCall
from worker.contract.network import NetworkFields
from worker.contract.run_limits import RunLimits
from worker.contract.wire import RUN_ID_PATTERN

DEFAULT_SYSTEM_PROMPT = (
    "You are a helpful assistant. You can use tools that work on files in your workspace; "
    "call them when they help, several at once when they are independent."
)
ORCHESTRATOR = "orchestrator"


class AgentOptions(ImageFields, NetworkFields):
    """How a conversation runs (in which image: ``ImageFields``; with which network:
    ``NetworkFields``). Unknown options are an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")

    system_prompt: str = Field(
        DEFAULT_SYSTEM_PROMPT, description="The system message the conversation starts with."
    )
    model: str | None = Field(None, description="Model name; TOOLQ_MODEL when unset.")
    session_context_file_path: str = Field(
        "session_context.json",
        description="Where in the workspace the save_session_context tool writes the conversation.",
    )
    max_turns: int | None = Field(None, gt=0, le=1000, description="TOOLQ_MAX_TURNS when unset.")
    run_id: str | None = Field(None, pattern=RUN_ID_PATTERN, description="Names the workspace.")
    enable: list[str] = Field(default_factory=list, description="Tools to switch on.")
    disable: list[str] = Field(default_factory=list, description="Tools to switch off.")
    tool_timeout_ms: int | None = Field(None, gt=0, description="Per-call deadline override.")
    limits: RunLimits | None = Field(
        None,
        description='The run\'s own limits for its commands, e.g. {"timeout_s": 10, '
        '"memory_mb": 512, "pids": 64}: each at most TOOLQ_LIMITS_MAX_* (the time: '
        "TOOLQ_MAX_TIMEOUT_MS); unset fields are the workers' defaults.",
    )
    time_limit_s: float | None = Field(
        None, gt=0, description="Wall time the conversation may take; then it stops (time_limit)."
    )
    token_limit: int | None = Field(
        None, gt=0, description="Tokens it may use; no model request is sent past them."
    )


@dataclass(frozen=True, slots=True)
class ToolCallRecord:
    """One tool call of the conversation, with where and how long it ran."""

    id: str
    name: str
    arguments: str
    output: str
    is_error: bool
    error_kind: str | None
    duration_ms: float
    wall_ms: float
    worker: str | None
    turn: int
    #: The pool that ran the call; None when the orchestrator ran it (a local tool).
    pool: str | None = None
    #: What the call's command used (run_bash), as its worker measured it: the fields of
    #: ``worker.contract.wire.ResourceUsage``. The tool's JSON answer in ``output`` has it too.
    usage: dict[str, Any] | None = None
    #: The output was cut to the output cap (a notice at its end says how much was left out).
    truncated: bool = False

    def finished_event(self) -> ToolCallFinished:
        """The event that tells this call's end to whoever watches the conversation: each field
        of the event is the record's own, by name."""
        names = [field.name for field in fields(ToolCallFinished) if field.name != "type"]
        return ToolCallFinished(**{name: getattr(self, name) for name in names})


def stopped_call(call: ModelToolCall, turn: int) -> ToolCallRecord:
    """A call the time limit cut short: its answer says so (the worker may still finish it)."""
    return ToolCallRecord(
        id=call.id,
        name=call.name,
        arguments=call.arguments,
        output="Error: the conversation's time limit was reached before this call finished.",
        is_error=True,
        error_kind="time_limit",
        duration_ms=0.0,
        wall_ms=0.0,
        worker=None,
        turn=turn,
    )
