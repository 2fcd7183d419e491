"""A batch's output, its state (with the attempt log, ``attempts.py``): whole JSONL lines
appended, resumable after any kill.

Each finished conversation is appended as one whole line, so after Ctrl-C, a crash or a kill the
ids already in the output are the ones that are done, and running the same batch again runs only
the rest. The file is only ever appended to: an item run again (``--retry-errors``) adds a line,
and every reader takes the last line of each id (``read_latest``), as a ``BatchRecord`` reads it.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, Self, TypeVar

from api.batch.input_scan import numbered_lines
from api.batch.record import BatchRecord, RecordStatus
from api.exceptions import OutputBusyError

#: How often, at most, finished lines are forced to disk while a batch runs (and once at the end).
#: A killed process loses nothing either way: every line is in the kernel as soon as it is written.
#: Only a machine crash can lose the last few seconds of lines, and a rerun simply redoes those.
FSYNC_INTERVAL_S = 5.0


_T = TypeVar("_T")


class AppendedLog:
    """A file of JSON lines open for appending (``O_APPEND``), opened by ``open``, which reads
    what it holds: each line written in one system call, so no reader sees half of it; forced
    to disk at most every ``FSYNC_INTERVAL_S``, and once when closed (once, or as a context
    manager)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        #: What ``open`` cut off the end: the partial line of a write a kill interrupted.
        self.truncated_bytes = 0
        self._fd: int | None = None
        self._last_sync = time.monotonic()

    @classmethod
    def open(cls, path: Path) -> Self:
        """The log at ``path`` (made if missing), its partial last line dropped and its lines
        read, open for appending."""
        opened = cls(path)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            opened._claim(fd)
            opened.truncated_bytes = truncate_partial_line(fd)
            opened._read()
        except BaseException:
            os.close(fd)
            raise
        opened._fd = fd
        opened._last_sync = time.monotonic()
        return opened

    def _claim(self, fd: int) -> None:
        """Runs before anything in the file is touched: a log that must be its only writer
        locks it here."""

    def _read(self) -> None:
        """Takes in the lines already in the file, for a log that keeps what they say."""

    def _write(self, record: object) -> None:
        """One line in one system call, so no reader sees half of it."""
        if self._fd is None:
            raise ValueError(f"{self.path} is not open")
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        written = os.write(self._fd, line)
        while written < len(line):  # only a full disk or a quota stops a file write short
            written += os.write(self._fd, line[written:])
        now = time.monotonic()
        if now - self._last_sync >= FSYNC_INTERVAL_S:
            os.fsync(self._fd)
            self._last_sync = now

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class ResultLog(AppendedLog):
    """The output JSONL: which ids are done, and appends of whole lines that survive a kill.

    ``open`` takes an exclusive lock (two batches on one output would run items twice), drops a
    partial last line left by a kill mid-write, and reads the ids already there.
    """

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        #: Each id's status, from its last line.
        self.done: dict[str, RecordStatus] = {}
        #: Whether each scored id passed, from its last line.
        self.passed: dict[str, bool] = {}
        self.unreadable_lines: list[int] = []

    def _claim(self, fd: int) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise OutputBusyError(
                f"another toolq batch is writing {self.path}; wait for it or stop it first"
            ) from None

    def _read(self) -> None:
        latest = read_latest(self.path, _outcome)
        self.unreadable_lines = latest.unreadable
        for item_id, (status, passed) in latest.records.items():
            self._note(item_id, status, passed)

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, in one system call, so no reader sees half of it;
        ``NotABatchRecord`` for one without an id, which is not written."""
        result = BatchRecord.read(record)
        self._write(record)
        self._note(result.id, *_outcome(result))

    def _note(self, item_id: str, status: RecordStatus, passed: bool | None) -> None:
        self.done[item_id] = status
        if passed is None:
            self.passed.pop(item_id, None)
        else:
            self.passed[item_id] = passed


def truncate_partial_line(fd: int, chunk: int = 65_536) -> int:
    """Cut the file after its last newline; returns the bytes removed."""
    size = os.fstat(fd).st_size
    end = size
    while end > 0:
        start = max(0, end - chunk)
        data = os.pread(fd, end - start, start)
        newline = data.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    else:
        keep = 0
    if keep < size:
        os.ftruncate(fd, keep)
    return size - keep


@dataclass
class Latest(Generic[_T]):
    """Each id's last line of a results file, as the reader keeps it, in the order ids first
    appeared, and the numbers of the lines that are not results."""

    records: dict[str, _T]
    unreadable: list[int]


def read_latest(path: Path, keep: Callable[[BatchRecord], _T]) -> Latest[_T]:
    """The last line of each id in ``path``, as ``keep`` makes of it.

    The one rule every reader of a results file follows: an id's later line (an item run again)
    replaces its earlier ones. ``keep`` lets a reader hold only what it needs of a large file.
    """
    latest: dict[str, _T] = {}
    unreadable: list[int] = []
    for number, record in _records(path):
        if record is None:
            unreadable.append(number)
        else:
            latest[record.id] = keep(record)
    return Latest(latest, unreadable)


def _records(path: Path) -> Iterator[tuple[int, BatchRecord | None]]:
    """Each line as a result, or None for one that is none: not JSON, not an object, no id."""
    for number, raw in numbered_lines(path):
        try:
            line = json.loads(raw)
            record = BatchRecord.read(line) if isinstance(line, dict) else None
        except ValueError:
            record = None
        yield number, record


def _outcome(record: BatchRecord) -> tuple[RecordStatus, bool | None]:
    """What resuming needs of a line: its status, and whether it passed when it was scored."""
    return record.status, record.passed
