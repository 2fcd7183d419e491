"""The service operations, each a typed pair: its name, the request it takes and the answer it
gives. They are the one definition of the operations' JSON, for the workers that serve them
(``worker/tools/service.py``, ``worker/tools/environment_service.py``) and the callers that send
them (``api.runs.workspace``, ``api.runs.environment``).

A path or an image the operation cannot use is an answer, a ``Refusal`` (``{"ok": false,
"error": ..., "message": ...}``) the caller can act on; a call that could not run at all is a
tool error, as for any tool. The request models have no docstrings: a docstring would become
the description of the schema their workers publish.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass
from typing import Any, Generic, Literal, Never, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from worker.contract.deadlines import EXEC_TIMEOUT_MS, START_ENVIRONMENT_TIMEOUT_MS
from worker.contract.image_reference import MAX_REFERENCE_CHARS
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, MAX_COLLECTED_FILES
from worker.contract.variables import Variables
from worker.contract.wire import CommandAnswer, Pool

#: A file's content on the wire: UTF-8 text, or ``{"base64": "..."}`` for bytes.
Content = str | dict[str, str]
#: Why a path could not be used. ``in_use`` is the caller's word for a workspace that stays
#: held by another call of its run (the worker answers ``kept``, and the caller stops waiting).
FileProblem = Literal[
    "not_found", "is_a_directory", "not_a_regular_file", "too_large", "refused", "in_use"
]


class OperationRequest(BaseModel):
    """Base of an operation's request: an argument it does not take is refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


class PutFilesRequest(OperationRequest):
    files: dict[str, Content] = Field(
        description='Workspace-relative path -> UTF-8 text, or {"base64": "..."} for bytes.'
    )


class ReadFileRequest(OperationRequest):
    path: str = Field(min_length=1, description="Workspace-relative path of a regular file.")
    max_bytes: int | None = Field(None, gt=0, description="Refuse a larger file.")


class CollectFilesRequest(OperationRequest):
    patterns: list[str] = Field(
        min_length=1, description="Workspace-relative globs, e.g. 'out/*.txt' or '**/*.json'."
    )
    max_files: int = Field(MAX_COLLECTED_FILES, gt=0, le=MAX_COLLECTED_FILES)
    max_file_bytes: int = Field(
        DEFAULT_OUTPUT_CAP_BYTES, gt=0, description="Each file's content is cut here."
    )


class NoArguments(OperationRequest):
    """Arguments of a tool that takes none."""


class ListWorkspacesRequest(OperationRequest):
    prefix: str = Field(min_length=1, description="Only the runs whose ids start with this.")


class ExecRequest(OperationRequest):
    argv: list[str] | None = Field(None, min_length=1, description="The program and arguments.")
    command: str | None = Field(None, min_length=1, description="Or a /bin/sh -c command line.")
    input: Content | None = Field(None, description="Standard input: text or {'base64': ...}.")
    cwd: str | None = Field(None, description="Workspace-relative directory; default the root.")
    env: Variables = Field(default_factory=dict)
    timeout_ms: int = Field(EXEC_TIMEOUT_MS, gt=0)
    output_cap_bytes: int = Field(
        DEFAULT_OUTPUT_CAP_BYTES,
        gt=0,
        description="Each stream keeps this many bytes, then a notice of the cut.",
    )

    @field_validator("argv")
    @classmethod
    def _no_nul(cls, argv: list[str] | None) -> list[str] | None:
        if argv and any("\x00" in part for part in argv):
            raise ValueError("an argument contains a NUL byte, which no command line can hold")
        return argv


class StartEnvironmentRequest(OperationRequest):
    image: str = Field(
        min_length=1,
        max_length=MAX_REFERENCE_CHARS,
        description="oci:/layout:tag, oci-archive:/x.tar, docker-archive:/x.tar, or a registry "
        "reference (python:3.12-slim, ghcr.io/org/x@sha256:...).",
    )
    user: str | None = Field(
        None, description="Who commands run as (name or uid[:gid]); default the image's User."
    )
    env: Variables = Field(default_factory=dict, description="Variables set over the image's Env.")
    timeout_ms: int = Field(START_ENVIRONMENT_TIMEOUT_MS, gt=0)


class WireAnswer(BaseModel):
    """Base of every answer: what the worker sends is its JSON, less the fields left empty."""

    #: The worker's word on the run, past the answer: its workspace is past its quota.
    notice: str | None = None

    def wire(self) -> dict[str, Any]:
        return self.model_dump(mode="json", exclude_none=True)


class Success(WireAnswer):
    """The operation was carried out."""

    ok: Literal[True] = True


class Refusal(WireAnswer):
    """The operation could not use what it was given; ``message`` says what and why."""

    ok: Literal[False] = False
    error: str
    message: str


class FileRefusal(Refusal):
    """A path the operation could not use."""

    error: FileProblem


class ImageRefusal(Refusal):
    """An image that could not be resolved, pulled or started; ``message`` names it."""

    error: Literal["image"] = "image"


class PutFilesAnswer(Success):
    #: Each file's size in bytes, by path.
    written: dict[str, int]


class PutFilesRefusal(FileRefusal):
    """A file that could not be written; the files before it in the request were."""

    written: dict[str, int]


class ReadFileAnswer(Success):
    size: int
    base64: str

    def data(self) -> bytes:
        return base64.b64decode(self.base64)


class CollectedFile(BaseModel):
    """One file that matched: its start (``content``, as text when it is UTF-8), its whole size,
    and whether ``content`` is cut."""

    content: str
    encoding: Literal["utf-8", "base64"]
    size: int
    truncated: bool


class CollectFilesAnswer(Success):
    files: dict[str, CollectedFile]
    #: How many files matched, including those past ``max_files``.
    matched: int


class RemoveWorkspaceAnswer(Success):
    #: False when ``kept``: another call of the run holds the workspace.
    removed: bool
    kept: str | None = None


class ListWorkspacesAnswer(Success):
    runs: list[str]
    #: How many runs matched, including those past the ones listed.
    matched: int


class ExecAnswer(CommandAnswer, Success):
    """What the command did, as run_bash answers (``ok`` first, then the command's fields)."""


class StartEnvironmentAnswer(Success):
    environment: str
    image: str
    digest: str
    #: The worker that holds the run's container, and the queue that reaches it.
    worker: str
    queue: str
    runtime: str
    workdir: str
    #: The uid and gid commands run as, inside the container.
    user: tuple[int, int]
    start_ms: int
    pulled: bool


class EndEnvironmentAnswer(Success):
    #: Whether the worker held a container of the run.
    ended: bool


RequestT = TypeVar("RequestT", bound=OperationRequest)
AnswerT = TypeVar("AnswerT", bound=Success, covariant=True)
RefusalT = TypeVar("RefusalT", bound=Refusal, covariant=True)


@dataclass(frozen=True, slots=True)
class Operation(Generic[RequestT, AnswerT, RefusalT]):
    """A service operation: its name and pool, what it takes, what it answers, and the refusal
    it may answer instead (None: it has none)."""

    name: str
    pool: Pool
    request: type[RequestT]
    answer: type[AnswerT]
    refusal: type[RefusalT] | None = None

    def arguments(self, request: RequestT) -> dict[str, Any]:
        """The call's arguments: those the caller gave, less those it left empty, so that the
        worker's defaults apply to the rest."""
        return request.model_dump(mode="json", exclude_unset=True, exclude_none=True)

    def read_answer(self, output: str) -> AnswerT | RefusalT:
        """The worker's answer (its JSON text); ``ValueError`` when it is not one of this
        operation's (a worker of another toolq version)."""
        raw = json.loads(output)
        if self.refusal is not None and isinstance(raw, dict) and raw.get("ok") is False:
            return self.refusal.model_validate(raw)
        return self.answer.model_validate(raw)


PUT_FILES: Operation[PutFilesRequest, PutFilesAnswer, PutFilesRefusal] = Operation(
    "toolq.put_files", "tools", PutFilesRequest, PutFilesAnswer, PutFilesRefusal
)
READ_FILE: Operation[ReadFileRequest, ReadFileAnswer, FileRefusal] = Operation(
    "toolq.read_file", "tools", ReadFileRequest, ReadFileAnswer, FileRefusal
)
COLLECT_FILES: Operation[CollectFilesRequest, CollectFilesAnswer, Never] = Operation(
    "toolq.collect_files", "tools", CollectFilesRequest, CollectFilesAnswer
)
REMOVE_WORKSPACE: Operation[NoArguments, RemoveWorkspaceAnswer, Never] = Operation(
    "toolq.remove_workspace", "tools", NoArguments, RemoveWorkspaceAnswer
)
LIST_WORKSPACES: Operation[ListWorkspacesRequest, ListWorkspacesAnswer, Never] = Operation(
    "toolq.list_workspaces", "tools", ListWorkspacesRequest, ListWorkspacesAnswer
)
EXEC: Operation[ExecRequest, ExecAnswer, Never] = Operation(
    "toolq.exec", "sandbox", ExecRequest, ExecAnswer
)
START_ENVIRONMENT: Operation[StartEnvironmentRequest, StartEnvironmentAnswer, ImageRefusal] = (
    Operation(
        "toolq.start_environment",
        "sandbox",
        StartEnvironmentRequest,
        StartEnvironmentAnswer,
        ImageRefusal,
    )
)
END_ENVIRONMENT: Operation[NoArguments, EndEnvironmentAnswer, ImageRefusal] = Operation(
    "toolq.end_environment", "sandbox", NoArguments, EndEnvironmentAnswer, ImageRefusal
)

#: Every service operation, by name.
OPERATIONS: dict[str, Operation[Any, Any, Any]] = {
    operation.name: operation
    for operation in (
        PUT_FILES,
        READ_FILE,
        COLLECT_FILES,
        REMOVE_WORKSPACE,
        LIST_WORKSPACES,
        EXEC,
        START_ENVIRONMENT,
        END_ENVIRONMENT,
    )
}


def request_problems(error: ValidationError) -> str:
    """Why a request is not valid, each problem naming its argument, as a worker says it."""
    return "; ".join(
        f"{'.'.join(str(part) for part in problem['loc']) or 'arguments'!r}: {problem['msg']}"
        for problem in error.errors(include_url=False)
    )
