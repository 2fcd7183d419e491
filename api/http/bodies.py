"""The JSON bodies of the HTTP API, and the error answers its routes document."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field, model_validator

from api.agent import AgentOptions
from api.batch.items import BatchItem


class RunRequest(BaseModel):
    """A conversation to run: the user's message and the agent's options."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="The user's message.")
    options: AgentOptions = Field(
        default_factory=AgentOptions,
        description="Agent options; options.run_id names the workspace (default: the run's id).",
    )


class BatchRequest(BaseModel):
    """Many conversations, run ``concurrency`` at a time."""

    model_config = ConfigDict(extra="forbid")

    items: list[BatchItem] = Field(min_length=1)
    concurrency: int = Field(10, ge=1, le=1000, description="Conversations in flight at once.")
    model: str | None = Field(None, description="Model for items without one (TOOLQ_MODEL).")

    @model_validator(mode="after")
    def _unique_ids(self) -> BatchRequest:
        seen: set[str] = set()
        for item in self.items:
            if item.id in seen:
                raise ValueError(f"duplicate item id {item.id!r}: ids name the results")
            seen.add(item.id)
        return self


class Accepted(BaseModel):
    id: str
    status: str


class ToolInfo(BaseModel):
    name: str
    pool: str
    description: str
    parameters: dict[str, Any]
    enabled_by_default: bool
    idempotent: bool
    live_workers: int = Field(description="Workers of the tool's pool alive right now.")


class Problem(BaseModel):
    detail: str


class Health(BaseModel):
    status: str
    replica: str
    redis: bool


Responses = dict[int | str, dict[str, Any]]

#: Every route behind the token can answer this.
UNAUTHORIZED: Responses = {401: {"model": Problem, "description": "Missing or wrong bearer token."}}
#: A request to start runs or batches can be refused before anything starts.
START_REFUSED: Responses = {
    413: {"model": Problem, "description": "The body is over the size limit."},
    503: {"model": Problem, "description": "No workers, or Redis unreachable."},
}
