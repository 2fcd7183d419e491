"""One conversation's line in a batch's results: what ``toolq batch -o`` appends, what the HTTP
API keeps of a batch's items, and what every reader of those lines takes from them (resume,
``toolq report``, the progress, the viewer).

A line is built as a ``BatchRecord`` and written as its ``line()``. It is read back with
``BatchRecord.read``, which takes what an older toolq wrote or a hand-edited file holds: a field
missing, or of another shape than it has here, reads as its default. Only a line without an id
is not a result at all.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, NewType

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from api.exceptions import NotABatchRecord

#: How a conversation ended: it answered ("ok"), or it failed ("error": ``error`` says why).
RecordStatus = Literal["ok", "error"]

#: A ``BatchRecord`` as the JSON object of its line, on its way from the conversation's runner
#: (the agents pool's answer among them) to the results: only ``BatchRecord.line`` makes one.
BatchLine = NewType("BatchLine", dict[str, Any])


class _LinePart(BaseModel):
    """Strict types, as the JSON of a line holds them (no text read as a number, no number as a
    flag); fields this toolq does not name are kept as they are, and written again."""

    model_config = ConfigDict(strict=True, extra="allow")


class TokenUsage(_LinePart):
    """The tokens of a conversation, its model requests together."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


class Score(_LinePart):
    """How the answer was judged, when the item has a target or a check command."""

    passed: bool
    method: str | None = Field(None, description='"target", "check" or "both".')
    explanation: str | None = None


class CommandRun(_LinePart):
    """A set-up or check command, as it ran in the run's workspace."""

    exit_code: int
    duration_ms: int | None = None
    stdout: str = ""
    stderr: str = ""
    timed_out: bool = False


class BatchRecord(_LinePart):
    """One conversation's line: what it said and did, as far as it got, and how its task went.

    The fields are written in this order; a line of a newer toolq keeps its other fields.
    """

    id: str = Field(
        description="The item's id; an integer id reads as its digits. A line without one (a "
        "string or an integer) is not a result."
    )
    status: RecordStatus = Field(
        "error",
        description='"ok" when the conversation answered, "error" when it failed. A line without '
        'a status, or with any other, reads as "error": only a line that says "ok" succeeded, and '
        "``toolq batch --retry-errors`` runs every other again.",
    )
    answer: str | None = None
    error: str | None = Field(None, description="Why the item failed: the first thing that did.")
    stop_reason: str | None = None
    run_id: str | None = Field(None, description="Names the run's workspace.")
    model: str | None = None
    duration_s: float | None = None
    attempts: int = Field(1, description="Runs of the item, this one included.")
    earlier_run_ids: list[str] = Field(
        default_factory=list, description="The workspaces of earlier runs, kept, oldest first."
    )
    orchestrator: str | None = Field(None, description="``host:pid`` of the process that ran it.")
    usage: TokenUsage | None = None
    image: dict[str, Any] | None = Field(
        None, description="The run's image: its reference, the digest it resolved to, where."
    )
    score: Score | None = None
    setup: CommandRun | None = None
    check: CommandRun | None = None
    artifacts: dict[str, Any] | None = Field(None, description="Collected files, by path.")
    artifacts_matched: int | None = None
    metadata: dict[str, Any] | None = Field(None, description="The item's, copied.")
    tool_calls: list[dict[str, Any]] = Field(default_factory=list)
    messages: list[dict[str, Any]] = Field(default_factory=list)

    @field_validator("id", mode="before")
    @classmethod
    def _integer_id_as_text(cls, value: object) -> object:
        if isinstance(value, int) and not isinstance(value, bool):
            return str(value)
        return value

    @classmethod
    def read(cls, line: Mapping[str, Any]) -> BatchRecord:
        """A line as this toolq reads it, whoever wrote it; ``NotABatchRecord`` without an id."""
        try:
            return cls.model_validate(line)
        except ValidationError as exc:
            misshapen = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
        if not misshapen or "id" in misshapen:
            raise NotABatchRecord("not a result: it has no id (a string or an integer)")
        # Given, not left out: a status of another shape still says the line is a result.
        defaults = {
            name: cls.model_fields[name].get_default(call_default_factory=True)
            for name in misshapen
        }
        return cls.model_validate({**line, **defaults})

    def line(self) -> BatchLine:
        """The JSON object of its line."""
        return BatchLine(self.model_dump())

    @property
    def has_status(self) -> bool:
        """The line names a status, as every line toolq writes does; a line of a batch's input
        has an id and no status."""
        return "status" in self.model_fields_set

    @property
    def passed(self) -> bool | None:
        """The score's verdict: None when the item was not scored."""
        return None if self.score is None else self.score.passed

    @property
    def tokens(self) -> int | None:
        """All the conversation's tokens; None when the line does not say."""
        return None if self.usage is None else self.usage.total_tokens

    @property
    def tool_errors(self) -> int:
        """The tool calls that failed."""
        return sum(1 for call in self.tool_calls if call.get("is_error"))
