"""Which attempts of each item a batch started, so that an item run again starts clean.

A batch stopped mid-conversation (``kill -9``, Ctrl-C, a crash) leaves that conversation's
effects in its workspace, and tool calls it had sent may still land there after the stop. Its
next run must not start over in that half-used folder. So every attempt of an item gets a
workspace of its own: before the attempt touches anything (its files, its set-up, its first
model request) the batch appends it to ``OUTPUT.attempts``, beside the output file. On resume
an item with an attempt there but no result line counts that attempt as done, and its next one
gets the next run_id (``<run_id>-a2``): a new, empty workspace. The earlier ones are kept, not
reused, and the result line names them (``earlier_run_ids``).

The file is only appended to, one whole line per attempt, as the output is (``results.py``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from api.batch.input_scan import numbered_lines
from api.batch.record import BatchLine, BatchRecord
from api.batch.results import AppendedLog

log = logging.getLogger(__name__)

#: What follows an output file's name to name its attempt log.
ATTEMPTS_SUFFIX = ".attempts"


def attempts_path(output: Path) -> Path:
    """The attempt log of the batch writing ``output``."""
    return output.with_name(output.name + ATTEMPTS_SUFFIX)


def attempt_run_id(first_run_id: str, attempt: int) -> str:
    """The run_id (and so the workspace) of an item's ``attempt``: the first keeps the item's
    run_id, each later one adds its number, ``-a2``, ``-a3``. (A batch run_id ends in six hex
    digits, so no item's first run_id looks like another's later one.)"""
    if attempt < 1:
        raise ValueError(f"attempts are counted from 1, not {attempt}")
    return first_run_id if attempt == 1 else f"{first_run_id}-a{attempt}"


class StartedAttempt(BaseModel):
    """One line of the attempt log: an attempt of an item, logged before it began."""

    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, description="The item's id.")
    attempt: int = Field(ge=1, description="Runs of the item started so far, this one included.")
    run_id: str = Field(min_length=1, description="Names the attempt's workspace.")
    on_fleet: bool = Field(
        False, description="Sent to the agents pool, where it may go on after the batch stops."
    )


@dataclass(frozen=True)
class Attempt:
    """An attempt of an item, as its runner needs it."""

    number: int
    run_id: str
    #: The workspaces of the item's earlier attempts, oldest first: kept, not reused.
    earlier_run_ids: list[str] = field(default_factory=list)
    on_fleet: bool = False

    def counted_in(self, line: Mapping[str, Any]) -> BatchLine:
        """An agents pool's output line with this item's earlier attempts counted too: the pool
        counts only the runs of this attempt's conversation."""
        record = BatchRecord.read(line)
        counted = {
            "attempts": record.attempts + self.number - 1,
            "earlier_run_ids": [*self.earlier_run_ids, *record.earlier_run_ids],
        }
        return record.model_copy(update=counted).line()


class AttemptLog(AppendedLog):
    """``OUTPUT.attempts``: the attempts each item started, and appends of new ones.

    Open it while holding the output's lock (``ResultLog.open``): that lock keeps a second batch
    on the same output, and so on this log, away.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        #: Each item's attempts, oldest first.
        self.started: dict[str, list[StartedAttempt]] = {}

    def _read(self) -> None:
        for number, raw in numbered_lines(self.path):
            if not raw.strip():
                continue
            try:
                started = StartedAttempt.model_validate_json(raw)
            except ValidationError:
                # Only a hand-edited file has one: its attempt is not counted, and its workspace
                # may be used again.
                log.warning("%s:%d: not an attempt; ignored", self.path, number)
                continue
            self.started.setdefault(started.id, []).append(started)

    def last(self, item_id: str) -> Attempt | None:
        """The item's latest attempt, or None when it never started."""
        started = self.started.get(item_id)
        if not started:
            return None
        latest = started[-1]
        earlier = [s.run_id for s in started[:-1]]
        return Attempt(latest.attempt, latest.run_id, earlier, latest.on_fleet)

    def begin(self, item_id: str, first_run_id: str, *, on_fleet: bool = False) -> Attempt:
        """The item's next attempt, logged before it starts: its number, and a workspace no
        earlier attempt used."""
        started = self.started.setdefault(item_id, [])
        earlier = [s.run_id for s in started]
        number = max((s.attempt for s in started), default=0) + 1
        attempt = StartedAttempt(
            id=item_id,
            attempt=number,
            run_id=attempt_run_id(first_run_id, number),
            on_fleet=on_fleet,
        )
        self._write(attempt.model_dump(mode="json"))
        started.append(attempt)
        return Attempt(number, attempt.run_id, earlier, on_fleet)
