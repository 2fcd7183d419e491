"""The reliability report: rows that tests record, rendered as Markdown at the end of a run."""

from __future__ import annotations

import contextlib
import datetime as dt
import importlib.metadata
import os
import platform
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from api.local.stack import redis_server_binary
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.sandbox import SandboxConfig, SandboxError, describe_isolation

#: The order of the report's sections; a row's category must be one of these.
CATEGORIES = ("Faults", "Bad input", "Isolation", "HTTP API bad input")


@dataclass
class Counts:
    """What happened to the calls (or conversations) a row is about."""

    sent: int = 0
    answered: int = 0
    lost: int = 0
    duplicated: int = 0


@dataclass
class Row:
    """One fault or input, what should happen, and what did."""

    category: str
    case: str
    expected: str
    observed: str = ""
    counts: Counts | None = None
    passed: bool | None = None
    #: Set when the row shows a problem that is known and not fixed: why, and what would fix it.
    open_gap: str | None = None


@dataclass(frozen=True)
class Gap:
    title: str
    why: str


@dataclass
class Outcome:
    """Outcomes of one test function of another file (its parametrized cases together)."""

    passed: int = 0
    failed: int = 0
    skipped: int = 0


@dataclass
class Report:
    """Collects rows and gaps during the session; ``render`` makes the Markdown page."""

    rows: list[Row] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @contextlib.contextmanager
    def case(self, category: str, case: str, expected: str) -> Iterator[Row]:
        """A row that passes when the block ends normally and fails, saying why, when it raises.

        The block sets ``observed`` and ``counts`` as it learns them, before it asserts.
        """
        if category not in CATEGORIES:
            raise ValueError(f"unknown report category {category!r}")
        row = Row(category, case, expected)
        self.rows.append(row)
        try:
            yield row
        except BaseException as exc:
            row.passed = False
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            row.observed = f"{row.observed} — failed: {reason}".lstrip(" —")
            raise
        else:
            if row.passed is None:
                row.passed = True

    def gap(self, title: str, why: str) -> None:
        if all(g.title != title for g in self.gaps):
            self.gaps.append(Gap(title, why))

    def note(self, text: str) -> None:
        self.notes.append(text)

    def render(self, header: list[str]) -> str:
        lines = ["# Reliability and security, measured", "", *header, ""]
        totals = Counts()
        for category in CATEGORIES:
            rows = [r for r in self.rows if r.category == category]
            if not rows:
                continue
            lines += [f"## {category}", "", _TABLE_HEAD, _TABLE_RULE]
            for row in rows:
                lines.append(_table_row(row))
                if row.counts is not None:
                    for name in ("sent", "answered", "lost", "duplicated"):
                        setattr(totals, name, getattr(totals, name) + getattr(row.counts, name))
            lines.append("")
        failed = sum(1 for r in self.rows if r.passed is False)
        lines += [
            "## Summary",
            "",
            f"{len(self.rows)} rows: {sum(1 for r in self.rows if r.passed)} pass, {failed} fail, "
            f"{sum(1 for r in self.rows if r.passed is None)} not run in this session.",
            f"Calls and conversations counted: {totals.sent} sent, {totals.answered} answered, "
            f"{totals.lost} lost, {totals.duplicated} duplicated.",
            "",
        ]
        if self.notes:
            lines += ["## Notes", "", *(f"- {note}" for note in self.notes), ""]
        lines += ["## Open gaps", ""]
        gaps = [Gap(f"{r.category}: {r.case}", r.open_gap) for r in self.rows if r.open_gap]
        gaps += [
            Gap(f"{r.category}: {r.case}", f"unexpected failure: {r.observed}")
            for r in self.rows
            if r.passed is False and not r.open_gap
        ]
        gaps += self.gaps
        if not gaps:
            lines.append("None found.")
        lines += [f"- **{g.title}.** {g.why}" for g in gaps]
        return "\n".join(lines) + "\n"


_TABLE_HEAD = "| Fault or input | Should | Did | Sent | Answered | Lost | Duplicated | Result |"
_TABLE_RULE = "|---|---|---|---:|---:|---:|---:|---|"


def _table_row(row: Row) -> str:
    counts = row.counts
    numbers = (
        [str(counts.sent), str(counts.answered), str(counts.lost), str(counts.duplicated)]
        if counts is not None
        else ["", "", "", ""]
    )
    if row.passed is None:
        verdict = "not run"
    elif row.passed:
        verdict = "pass"
    else:
        verdict = "**FAIL (open)**" if row.open_gap else "**FAIL**"
    cells = [row.case, row.expected, row.observed, *numbers, verdict]
    return "| " + " | ".join(_cell(c) for c in cells) + " |"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# --- The header ----------------------------------------------------------------------------------


def machine_header(command: str, duration_s: float, outcome: str) -> list[str]:
    """Date, machine and versions, and how the page was made."""
    cores = os.cpu_count() or 0
    return [
        f"Generated {dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M UTC} by `{command}` "
        f"({outcome}; {duration_s:.0f} s). Every figure below comes from that run: real worker "
        "processes, a real Redis, the real `toolq batch` command.",
        "",
        f"- Machine: {_cpu_model()}, {cores} cores, Linux {platform.release()}",
        f"- Python {platform.python_version()}, Celery {_version('celery')}, "
        f"kombu {_version('kombu')}, redis-py {_version('redis')}, {_redis_server_version()}",
        f"- run_bash isolation here: {_isolation()}",
        "- Regenerate: `make reliability-report` (the reliability tests and the HTTP API's); "
        "`make test` writes the same report to pytest's temporary directory and prints where.",
    ]


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown CPU"


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _redis_server_version() -> str:
    try:
        text = subprocess.run(
            [redis_server_binary(), "--version"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "Redis (version unknown)"
    version = next((p.split("=", 1)[1] for p in text.split() if p.startswith("v=")), "unknown")
    return f"Redis {version}"


def _isolation() -> str:
    try:
        # What a sandbox worker of this machine gives with the fleet's defaults (a uid per run).
        default = SandboxConfig(SandboxSettings(uid_range=str(UidRange.parse(DEFAULT_UID_RANGE))))
        return ", ".join(describe_isolation(default))
    except SandboxError as exc:
        return f"unavailable ({exc})"
