"""The wire contract between orchestrator and workers: one request, one result, JSON only."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from worker.tools.context import ToolContextSnapshot

TASK_NAME = "toolq.execute_tool"

#: Why a call failed. The first five come from the registry; the rest from the layers around it.
ErrorKind = Literal[
    "unknown_tool",  # no tool of that name on the fleet
    "tool_disabled",  # the tool exists but is switched off
    "invalid_arguments",  # malformed JSON, wrong types, missing or unknown fields
    "tool_error",  # the tool raised
    "unserializable_result",  # the tool returned something JSON cannot hold
    "timeout",  # the tool ran past its deadline and was stopped
    "interrupted",  # the worker died mid-call; the tool has effects, so it is not run again
    "wrong_pool",  # the call reached a worker whose pool does not serve the tool
    "bad_request",  # the message was not a valid request
    "no_answer",  # no worker answered by the deadline (none listening, died, or too busy)
    "broker_unavailable",  # the call could not be sent
]

RUN_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$"


class ToolCallRequest(BaseModel):
    """One tool call, as the orchestrator sends it."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str = Field(min_length=1, max_length=256, description="Also the task id.")
    run_id: str = Field(pattern=RUN_ID_PATTERN, description="Names the run's workspace folder.")
    tool: str = Field(min_length=1, max_length=256)
    arguments: str | dict[str, Any] = Field(description="As the model sent them: raw JSON or dict.")
    context: ToolContextSnapshot = Field(default_factory=ToolContextSnapshot)
    timeout_ms: int = Field(gt=0, description="The tool's own deadline, already clamped.")
    deadline: float = Field(description="Epoch seconds after which nobody waits for the answer.")
    reply_to: str | None = Field(None, description="Redis list that receives the result.")


class ToolCallResult(BaseModel):
    """The answer to one tool call."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str
    tool: str
    output: str = Field(description="Text for the model, capped at the output limit.")
    is_error: bool = False
    error_kind: ErrorKind | None = None
    duration_ms: float = 0.0
    truncated: bool = False
    worker: str | None = Field(None, description="hostname:pid of the process that ran it.")
