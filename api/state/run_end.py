"""A run's end as its record keeps it: the one type the replica that ran the run writes, and
the agents worker that ran it sends back in its answer."""

from __future__ import annotations

from typing import Any, Literal, NewType

from pydantic import BaseModel, Field

#: How a run on the agents pool ended, as its replica records it.
RunOutcome = Literal["succeeded", "failed", "cancelled"]

#: A ``RunEnd`` as its JSON object, as the caller gets it back: only ``RunEnd.line`` makes one.
RunEndLine = NewType("RunEndLine", dict[str, Any])


class RunEnd(BaseModel):
    """How a run of the HTTP API ended, as its record keeps it: written by the replica that ran
    it, or sent to that replica by the agents worker that ran it (``line``)."""

    status: RunOutcome
    answer: str | None = None
    stop_reason: str | None = None
    error: str | None = None
    attempts: int | None = Field(
        None,
        description="Runs of the conversation on the agents pool, this one included; None when "
        "it ran in a replica.",
    )
    orchestrator: str | None = Field(
        None, description="hostname:pid of the process that ran it last, if one did."
    )
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    #: The conversation, when a replica ran it; the agents pool writes its own, and never sends
    #: it in its line.
    transcript: dict[str, Any] | None = Field(None, exclude=True)

    def line(self) -> RunEndLine:
        return RunEndLine(self.model_dump())
