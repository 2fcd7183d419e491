"""Reading a batch's input file: every line checked once, the ids done before counted, and the
lines still to run read again as they are needed."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from api.batch.items import BadLine, BatchItem, ItemLimits, parse_item

log = logging.getLogger(__name__)


@dataclass
class InputScan:
    """What an input file holds: its bad lines, the ids done before, the lines still to run."""

    path: Path
    limits: ItemLimits = field(default_factory=ItemLimits)
    bad_lines: list[BadLine] = field(default_factory=list)
    already_done: int = 0
    already_failed: int = 0
    #: Items whose earlier line has status error and that run again (``retry_errors``).
    retried: int = 0
    pending: list[int] = field(default_factory=list)
    #: The tools each pending line enables, for the lines that enable any.
    enables: dict[int, list[str]] = field(default_factory=dict)

    def items(self) -> Iterator[BatchItem]:
        """The items still to run, read again from the file as they are needed."""
        wanted = set(self.pending)
        for number, raw in numbered_lines(self.path):
            if number in wanted:
                try:
                    yield parse_item(raw, self.limits)
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


def scan_input(
    path: Path,
    done: Mapping[str, str],
    *,
    limits: ItemLimits | None = None,
    retry_errors: bool = False,
) -> InputScan:
    """Check every line; ``done`` maps the ids already in the output to their status.

    Blank lines are ignored. A repeated id is a bad line: the first line with it is the item.
    With ``retry_errors`` an item whose line has status error runs again.
    """
    scan = InputScan(path, limits or ItemLimits())
    first_line: dict[str, int] = {}
    for number, raw in numbered_lines(path):
        if not raw.strip():
            continue
        try:
            item = parse_item(raw, scan.limits)
        except ValueError as exc:
            scan.bad_lines.append(BadLine(number, str(exc)))
            continue
        if item.id in first_line:
            reason = f"duplicate id {item.id!r} (first on line {first_line[item.id]})"
            scan.bad_lines.append(BadLine(number, reason))
            continue
        first_line[item.id] = number
        status = done.get(item.id)
        if status is None or (status != "ok" and retry_errors):
            scan.pending.append(number)
            if status is not None:
                scan.retried += 1
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
