"""A batch's input: one task per JSONL line, each line checked before anything runs.

A line is a conversation (``prompt``) and, optionally, what makes it a task: files and a set-up
command that prepare its workspace, a target or a check command that judge it, artifacts to
bring back, limits and metadata.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import posixpath
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    field_validator,
)

from api.images.fields import ImageFields
from api.settings import OrchestratorSettings
from worker.contract.deadlines import REPORT_MARGIN_MS
from worker.contract.network import (
    ONLY_NONE,
    NetworkAllowance,
    NetworkFields,
    network_refusal,
)
from worker.contract.run_limits import LimitsFields, LimitsMax
from worker.contract.wire import glob_segments

log = logging.getLogger(__name__)

#: A set-up or check command's time limit when the item gives none (seconds).
DEFAULT_COMMAND_TIMEOUT_S = 300.0
#: What a command's call needs beyond the command's own limit to report how it ended: the
#: call's limit is the command's plus this (worker.contract.deadlines).
REPORT_MARGIN_S = REPORT_MARGIN_MS / 1000


#: One name of a workspace path as the schema documents it: not empty, not "." or "..", no "/" or
#: NUL. (The line check accepts a little more, such as "a/../b"; what the schema allows, it takes.)
_NAME = r"(?:[^/\x00.][^/\x00]*|\.[^/\x00.][^/\x00]*|\.\.[^/\x00]+)"
#: A file's path below the workspace.
FILE_PATH_PATTERN = rf"^{_NAME}(?:/{_NAME})*$"
#: An artifacts glob: names below the workspace, a final "/" for directories only.
GLOB_PATTERN = rf"^{_NAME}(?:/{_NAME})*/?$"
#: Why a path or pattern that stays inside the workspace is still refused: one spelling per path,
#: as the schema documents.
NOT_PLAIN = "is not a plain path: names joined by single '/', none of them '.' or '..'"
#: Standard base64 as ``base64.b64decode(..., validate=True)`` takes it.
BASE64_PATTERN = r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/]{2}==|[A-Za-z0-9+/]{3}=)?$"


class FileBytes(BaseModel):
    """A file's content as bytes: ``{"base64": "..."}``."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    base64: str = Field(json_schema_extra={"pattern": BASE64_PATTERN})

    @property
    def data(self) -> bytes:
        return base64.b64decode(self.base64, validate=True)

    @property
    def size(self) -> int:
        """How many bytes ``data`` holds, without decoding them (the text is valid base64)."""
        return len(self.base64) // 4 * 3 - self.base64[-2:].count("=")


def _check_files(value: object) -> object:
    """Each path workspace-relative and each content text or valid base64, named when not."""
    if not isinstance(value, Mapping):
        return value  # the type check says what it should be
    for path, content in value.items():
        if not isinstance(path, str):
            raise ValueError(f"the key {path!r} is not a string: keys are paths")
        problem = _path_problem(path)
        if problem:
            raise ValueError(f"{path!r} {problem}")
        if isinstance(content, str):
            continue
        if not (isinstance(content, Mapping) and set(content) == {"base64"}):
            found = (
                f"an object with the keys {', '.join(map(repr, content))}"
                if isinstance(content, Mapping)
                else _json_kind(content)
            )
            raise ValueError(
                f'{path!r}: the content must be a string (UTF-8 text) or {{"base64": "..."}}, '
                f"not {found}"
            )
        encoded = content["base64"]
        try:
            if not isinstance(encoded, str):
                raise TypeError
            base64.b64decode(encoded, validate=True)
        except (TypeError, binascii.Error, ValueError):
            raise ValueError(f"{path!r}: the base64 content is not valid base64") from None
    return value


def _path_problem(path: str) -> str | None:
    """Why ``path`` cannot name a file of the workspace, or None."""
    if not path or "\x00" in path:
        return "is not a file name" if not path else "contains a NUL byte"
    if path.startswith("/"):
        return "is absolute: paths are relative to the workspace"
    normal = posixpath.normpath(path)
    if normal == ".." or normal.startswith("../"):
        return "leads outside the workspace"
    if normal == "." or path.endswith("/"):
        return "names a directory, not a file"
    if not re.fullmatch(FILE_PATH_PATTERN, path):
        return NOT_PLAIN
    return None


FileContent = str | FileBytes
Files = Annotated[dict[str, FileContent], BeforeValidator(_check_files)]


class BatchItem(ImageFields, NetworkFields, LimitsFields):
    """One task of a batch: a line of the input file (its image: ``ImageFields``; its
    network: ``NetworkFields``; its own limits: ``LimitsFields``)."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Unique within the file; names the output line.")
    prompt: str = Field(min_length=1, description="The user's message.")
    system_prompt: str | None = Field(None, description="Default: the agent's system prompt.")
    model: str | None = Field(None, description="Default: --model, else TOOLQ_MODEL.")
    enable: list[str] = Field(default_factory=list, description="Tools to switch on.")
    max_turns: int | None = Field(None, gt=0, le=1000, description="Default: TOOLQ_MAX_TURNS.")
    files: Files | None = Field(
        None,
        description='Workspace-relative path -> UTF-8 text, or {"base64": "..."} for bytes; '
        "written before the conversation.",
        json_schema_extra={"propertyNames": {"pattern": FILE_PATH_PATTERN}},
    )
    setup: str | None = Field(
        None, min_length=1, description="A shell command run in the sandbox before the model."
    )
    setup_timeout_s: float | None = Field(None, gt=0, description="Default 300 s.")
    target: str | None = Field(
        None,
        min_length=1,
        description="Passed when the final answer contains it (any case).",
        json_schema_extra={"pattern": r"\S"},  # not blank: said by the check below, in words
    )
    check: str | None = Field(
        None, min_length=1, description="A shell command run after the conversation; 0 passes."
    )
    check_timeout_s: float | None = Field(None, gt=0, description="Default 300 s.")
    artifacts: list[Annotated[str, Field(json_schema_extra={"pattern": GLOB_PATTERN})]] | None = (
        Field(None, description="Workspace-relative globs of files to bring back in the result.")
    )
    time_limit_s: float | None = Field(None, gt=0, description="The conversation's wall time.")
    token_limit: int | None = Field(None, gt=0, description="Tokens the conversation may use.")
    metadata: dict[str, Any] | None = Field(None, description="Copied to the result line.")

    @field_validator("target")
    @classmethod
    def _target_has_text(cls, target: str | None) -> str | None:
        if target is not None and not target.strip():
            raise ValueError("the target is blank: no answer could be said to contain it")
        return target

    @field_validator("artifacts")
    @classmethod
    def _patterns_stay_inside(cls, patterns: list[str] | None) -> list[str] | None:
        for pattern in patterns or []:
            try:
                glob_segments(pattern)
            except ValueError as exc:
                raise ValueError(f"the pattern {pattern!r} {exc}") from None
            if not re.fullmatch(GLOB_PATTERN, pattern):
                raise ValueError(f"the pattern {pattern!r} {NOT_PLAIN}")
        return patterns

    @property
    def is_task(self) -> bool:
        """Whether the item prepares or inspects its workspace beyond the conversation."""
        return any(
            v is not None for v in (self.files, self.setup, self.check, self.artifacts, self.image)
        )

    def file_contents(self) -> dict[str, str | bytes]:
        return {
            path: content if isinstance(content, str) else content.data
            for path, content in (self.files or {}).items()
        }


@dataclass(frozen=True)
class ItemLimits:
    """What a line may ask for on this orchestrator and fleet."""

    files_max_bytes: int = OrchestratorSettings.model_fields["task_files_max_bytes"].default
    #: The longest call the fleet allows (TOOLQ_MAX_TIMEOUT_MS), in seconds.
    max_call_s: float = OrchestratorSettings.model_fields["max_timeout_ms"].default / 1000
    #: The network a line may ask for (TOOLQ_NETWORK_ALLOWED).
    network: NetworkAllowance = ONLY_NONE
    #: The most a line's own limits may ask (TOOLQ_LIMITS_MAX_*).
    limits_max: LimitsMax = field(default_factory=LimitsMax)

    @classmethod
    def from_settings(cls, settings: OrchestratorSettings) -> ItemLimits:
        return cls(
            settings.task_files_max_bytes,
            settings.max_timeout_ms / 1000,
            settings.network_allowance,
            settings.limits_max,
        )

    @property
    def max_command_s(self) -> float:
        """The longest set-up or check: the call also needs time to report how it ended."""
        return max(self.max_call_s - REPORT_MARGIN_S, self.max_call_s / 2)

    def command_timeout_s(self, asked: float | None) -> float:
        """A command's limit: the one asked for, else the default the fleet allows."""
        return asked if asked is not None else min(DEFAULT_COMMAND_TIMEOUT_S, self.max_command_s)

    def problems(self, item: BatchItem) -> list[tuple[str, str]]:
        """(field, what is wrong) for what ``item`` asks beyond these limits."""
        found = []
        size = sum(len(c) if isinstance(c, str) else c.size for c in (item.files or {}).values())
        if size > self.files_max_bytes:
            found.append(
                (
                    "files",
                    f"{size:,} bytes in all, more than TOOLQ_TASK_FILES_MAX_BYTES "
                    f"({self.files_max_bytes:,})",
                )
            )
        for name in ("setup_timeout_s", "check_timeout_s"):
            asked = getattr(item, name)
            if asked is not None and asked > self.max_command_s:
                found.append(
                    (
                        name,
                        f"{asked:g} s is more than this fleet allows: at most "
                        f"{self.max_command_s:g} s (TOOLQ_MAX_TIMEOUT_MS, less "
                        f"{REPORT_MARGIN_S:g} s to report)",
                    )
                )
        refused = network_refusal(item.network, self.network)
        if refused is not None:
            found.append(("network", refused))
        over = item.limits and self.limits_max.refusal(item.limits, round(self.max_call_s * 1000))
        if over:
            found.append(("limits", over))
        return found


# --- Reading the input ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BadLine:
    """An input line that was skipped, and why."""

    number: int
    reason: str


def parse_item(raw: bytes | str, limits: ItemLimits | None = None) -> BatchItem:
    """One input line as an item; ``ValueError`` says what is wrong with it, field by field."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({json_problem(exc)})") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {_json_kind(value)}")
    try:
        item = BatchItem.model_validate(value)
    except ValidationError as exc:
        raise ValueError(_validation_problems(exc)) from None
    beyond = (limits or ItemLimits()).problems(item)
    if beyond:
        raise ValueError("; ".join(f"{name}: {problem}" for name, problem in beyond))
    return item


def json_problem(exc: json.JSONDecodeError) -> str:
    """What is wrong and at which column: some of Python's messages end with "at" already
    ("Unterminated string starting at")."""
    place = f"column {exc.colno}"
    return f"{exc.msg} {place}" if exc.msg.endswith(" at") else f"{exc.msg} at {place}"


def _json_kind(value: object) -> str:
    kinds = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}
    return kinds.get(type(value), "a number")


def _validation_problems(exc: ValidationError) -> str:
    """What is wrong with a line that is a JSON object but not an item, field by field."""
    allowed = ", ".join(BatchItem.model_fields)
    problems = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "missing":
            problems.append(f"missing {where!r}")
        elif error["type"] == "extra_forbidden" and len(error["loc"]) > 1:  # in a field's object
            problems.append(f"unknown field {where!r}")
        elif error["type"] == "extra_forbidden":
            problems.append(f"unknown field {where!r} (fields: {allowed})")
        elif error["type"] == "value_error":  # our own message, without pydantic's prefix
            problems.append(f"{where}: {error['ctx']['error']}")
        else:
            problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)
