"""The JSON bodies of the HTTP API, and the error answers its routes document."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from api.batch.items import BatchItem
from api.conversation.agent import AgentOptions
from api.state.batches import BatchSummary
from api.state.listing import MAX_TAGS, TAG_PATTERN
from api.state.runs import RunSummary

#: Labels a run or a batch starts with, for the lists to filter by (``?tag=``).
Tags = Annotated[
    list[Annotated[str, Field(pattern=TAG_PATTERN)]],
    Field(
        max_length=MAX_TAGS,
        description=f"Labels to find it by in the lists (?tag=): at most {MAX_TAGS}, each 1 to "
        "64 letters, digits or ._:/=- (starting with a letter or digit).",
    ),
]

#: Where a list's page ended, for the next one.
NextCursor = Annotated[
    str | None,
    Field(description="Pass it as ?cursor= for the next page; null on the last one."),
]


class RunRequest(BaseModel):
    """A conversation to run: the user's message and the agent's options."""

    model_config = ConfigDict(extra="forbid")

    prompt: str = Field(min_length=1, description="The user's message.")
    options: AgentOptions = Field(
        default_factory=AgentOptions,
        description="Agent options; options.run_id names the workspace (default: the run's id).",
    )
    tags: Tags = Field(default_factory=list)


class BatchRequest(BaseModel):
    """Many conversations, run ``concurrency`` at a time."""

    model_config = ConfigDict(extra="forbid")

    items: list[BatchItem] = Field(min_length=1)
    concurrency: int = Field(10, ge=1, le=1000, description="Conversations in flight at once.")
    model: str | None = Field(None, description="Model for items without one (TOOLQ_MODEL).")
    tags: Tags = Field(default_factory=list)

    def id_conflicts(self) -> list[FieldProblem]:
        """Items whose id an earlier item has: ids name the results, so each must be unique.

        Not a validation rule of the body: JSON Schema cannot say "unique by id", and a body the
        schema allows is answered 409 rather than 422.
        """
        first: dict[str, int] = {}
        problems = []
        for index, item in enumerate(self.items):
            if item.id in first:
                problems.append(
                    FieldProblem(
                        field=f"items.{index}.id",
                        where="body",
                        message=f"duplicate item id {item.id!r} (first at items.{first[item.id]}):"
                        " ids name the results",
                        type="duplicate_id",
                    )
                )
            first.setdefault(item.id, index)
        return problems


class RunList(BaseModel):
    """One page of the runs, newest first, and how many match in all."""

    runs: list[RunSummary]
    total: int = Field(description="Runs matching the filters, on every page.")
    limit: int
    next_cursor: NextCursor


class BatchList(BaseModel):
    """One page of the batches, newest first, and how many match in all."""

    batches: list[BatchSummary]
    total: int = Field(description="Batches matching the filters, on every page.")
    limit: int
    next_cursor: NextCursor


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


class FieldProblem(BaseModel):
    """One thing wrong with a request."""

    model_config = ConfigDict(populate_by_name=True)

    field: str = Field(
        description="The field, dotted (options.max_turns, items.0.prompt), or 'body'."
    )
    where: str = Field(alias="in", description="Where the field is: body, query, path or header.")
    message: str
    type: str = Field(description="The kind of problem, as pydantic names it (missing, ...).")


class ValidationProblem(BaseModel):
    """A request refused before anything started, each problem named with its field."""

    detail: str = Field(description="Every problem on one line: 'field: message; ...'.")
    errors: list[FieldProblem]


class Health(BaseModel):
    status: str
    replica: str
    redis: bool


Responses = dict[int | str, dict[str, Any]]

#: Every route behind the token can answer this.
UNAUTHORIZED: Responses = {401: {"model": Problem, "description": "Missing or wrong bearer token."}}
#: Every route that takes parameters or a body can refuse them.
INVALID: Responses = {
    422: {"model": ValidationProblem, "description": "The request is not valid: see `errors`."}
}
#: Every route that reads the state store can find it unreachable.
UNREACHABLE: Responses = {503: {"model": Problem, "description": "Redis is unreachable."}}
#: A request to start runs or batches can be refused before anything starts.
ID_CONFLICT: Responses = {
    409: {"model": ValidationProblem, "description": "Two items share an id: see `errors`."}
}
START_REFUSED: Responses = {
    413: {"model": Problem, "description": "The body is over the size limit."},
    429: {
        "model": Problem,
        "description": "The token's tenant already holds as many live runs as its cap "
        "(TOOLQ_TENANT_MAX_RUNS) allows: the detail names the cap and its value.",
    },
    503: {
        "model": Problem,
        "description": "No workers, no model API configured here, or Redis unreachable.",
    },
}


def refusal(errors: list[FieldProblem], status_code: int = 422) -> JSONResponse:
    """The answer to a request refused for what is in it: every problem, with its field."""
    summary = "; ".join(f"{e.field}: {e.message}" for e in errors)
    body = ValidationProblem(detail=summary, errors=errors)
    return JSONResponse(body.model_dump(by_alias=True), status_code=status_code)
