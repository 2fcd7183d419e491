"""A batch's input: one conversation per JSONL line, each line checked before anything runs."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

log = logging.getLogger(__name__)


class BatchItem(BaseModel):
    """One conversation of a batch: a line of the input file."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="Unique within the file; names the output line.")
    prompt: str = Field(min_length=1, description="The user's message.")
    system_prompt: str | None = Field(None, description="Default: the agent's system prompt.")
    model: str | None = Field(None, description="Default: --model, else TOOLQ_MODEL.")
    enable: list[str] = Field(default_factory=list, description="Tools to switch on.")
    max_turns: int | None = Field(None, gt=0, le=1000, description="Default: TOOLQ_MAX_TURNS.")


# --- Reading the input ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BadLine:
    """An input line that was skipped, and why."""

    number: int
    reason: str


def parse_item(raw: bytes | str) -> BatchItem:
    """One input line as an item; ``ValueError`` says what is wrong with it."""
    try:
        text = raw.decode("utf-8") if isinstance(raw, bytes) else raw
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not JSON ({exc.msg} at column {exc.colno})") from None
    if not isinstance(value, dict):
        raise ValueError(f"not a JSON object but {_json_kind(value)}")
    try:
        return BatchItem.model_validate(value)
    except ValidationError as exc:
        raise ValueError(_validation_problems(exc)) from None


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
        elif error["type"] == "extra_forbidden":
            problems.append(f"unknown field {where!r} (fields: {allowed})")
        else:
            problems.append(f"{where}: {error['msg']}")
    return "; ".join(problems)


@dataclass
class InputScan:
    """What an input file holds: its bad lines, the ids done before, the lines still to run."""

    path: Path
    bad_lines: list[BadLine] = field(default_factory=list)
    already_done: int = 0
    already_failed: int = 0
    pending: list[int] = field(default_factory=list)
    #: The tools each pending line enables, for the lines that enable any.
    enables: dict[int, list[str]] = field(default_factory=dict)

    def items(self) -> Iterator[BatchItem]:
        """The items still to run, read again from the file as they are needed."""
        wanted = set(self.pending)
        for number, raw in numbered_lines(self.path):
            if number in wanted:
                try:
                    yield parse_item(raw)
                except ValueError as exc:  # the file changed since the scan
                    log.warning("%s:%d: skipped: %s", self.path, number, exc)

    def refuse_unserved(self, unserved: Callable[[str], str | None]) -> list[BadLine]:
        """Make bad lines of the pending ones that enable a tool no live worker serves
        (``unserved`` says why, or None for a served tool), as the HTTP API refuses such
        items; they are returned too."""
        refused = []
        for number, tools in self.enables.items():
            reasons = [f"enable: {why}" for tool in tools if (why := unserved(tool))]
            if reasons:
                refused.append(BadLine(number, "; ".join(reasons)))
        numbers = {bad.number for bad in refused}
        self.pending = [number for number in self.pending if number not in numbers]
        self.bad_lines = sorted([*self.bad_lines, *refused], key=lambda bad: bad.number)
        return refused


def scan_input(path: Path, done: Mapping[str, str]) -> InputScan:
    """Check every line; ``done`` maps the ids already in the output to their status.

    Blank lines are ignored. A repeated id is a bad line: the first line with it is the item.
    """
    scan = InputScan(path)
    first_line: dict[str, int] = {}
    for number, raw in numbered_lines(path):
        if not raw.strip():
            continue
        try:
            item = parse_item(raw)
        except ValueError as exc:
            scan.bad_lines.append(BadLine(number, str(exc)))
            continue
        if item.id in first_line:
            reason = f"duplicate id {item.id!r} (first on line {first_line[item.id]})"
            scan.bad_lines.append(BadLine(number, reason))
            continue
        first_line[item.id] = number
        status = done.get(item.id)
        if status is None:
            scan.pending.append(number)
            if item.enable:
                scan.enables[number] = item.enable
        else:
            scan.already_done += 1
            if status != "ok":
                scan.already_failed += 1
    return scan


def numbered_lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """A file's lines as bytes, numbered from 1: a line need not be UTF-8 to be reported."""
    with path.open("rb") as lines:
        yield from enumerate(lines, start=1)
