"""What crosses the agents queue, defined once for callers and agents workers alike: a
conversation sent to run, and its answer (the Redis keys both sides keep about it are
``worker.contract.keys.conversation_keys``).

No key or secret travels here: an agents worker reads ``OPENAI_*`` from its own environment.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.batch.record import BatchLine
from api.state.run_end import RunEndLine
from worker.contract.wire import RUN_ID_PATTERN, TaskId

#: The one Celery task a conversation is.
CONVERSATION_TASK = "toolq.run_conversation"

#: Runs of one conversation at most: a conversation whose agents worker died this many times
#: (one that brings its worker down, say) is answered with an error rather than run again.
MAX_ATTEMPTS = 3

#: A conversation's lease on its agents worker: renewed every ``LEASE_RENEW_S`` while it runs,
#: gone ``LEASE_TTL_S`` after its worker died or lost the network. Callers run it again then.
LEASE_TTL_S = 15
LEASE_RENEW_S = 5.0


class LiveRun(BaseModel):
    """A conversation of the HTTP API's ``/v1/runs``: its events and transcript go to the run's
    record as it goes (``api/state/runs.py``), where its replica's readers follow it."""

    model_config = ConfigDict(extra="forbid")

    prompt: str
    options: dict[str, Any] = Field(
        description="``AgentOptions`` as JSON (api/conversation/agent_options.py)."
    )


class ConversationRequest(BaseModel):
    """One conversation, as a caller sends it to the agents queue: a batch item, or a run."""

    model_config = ConfigDict(extra="forbid")

    task_id: TaskId = Field(
        description="The message's id on the wire, also its Celery task id: new for every send."
    )
    conversation_id: str = Field(
        pattern=RUN_ID_PATTERN,
        description="The conversation's run_id: names its workspace, its lease, its answer.",
    )
    item: dict[str, Any] | None = Field(
        None, description="The batch item, as JSON (api/batch/items.py)."
    )
    run: LiveRun | None = Field(None, description="Or a run of the HTTP API.")
    default_model: str | None = Field(None, description="For an item that names no model.")
    timeout_s: float = Field(gt=0, description="How long the conversation may run.")
    reply_to: str | None = Field(None, description="Redis list that receives the answer.")

    @model_validator(mode="after")
    def _one_conversation(self) -> ConversationRequest:
        if (self.item is None) == (self.run is None):
            raise ValueError("a conversation request carries either an item or a run")
        return self


class ConversationResult(BaseModel):
    """The answer to one conversation: its output line, and which run of it made the line."""

    model_config = ConfigDict(extra="forbid")

    conversation_id: str
    task_id: str
    attempt: int = Field(ge=1)
    worker: str = Field(description="hostname:pid of the agents worker that ran it.")
    record: BatchLine | RunEndLine = Field(
        description="A batch item's output line (``api.batch.record``), or a run's "
        "end (``RunEnd``)."
    )
