"""A batch's output, its only state: whole JSONL lines appended, resumable after any kill.

Each finished conversation is appended as one whole line, so after Ctrl-C, a crash or a kill the
ids already in the output are the ones that are done, and running the same batch again runs only
the rest.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from api.batch.items import numbered_lines

#: How often, at most, finished lines are forced to disk while a batch runs (and once at the end).
#: A killed process loses nothing either way: every line is in the kernel as soon as it is written.
#: Only a machine crash can lose the last few seconds of lines, and a rerun simply redoes those.
FSYNC_INTERVAL_S = 5.0


class OutputBusyError(RuntimeError):
    """Another batch is appending to this output file right now."""


class ResultLog:
    """The output JSONL: which ids are done, and appends of whole lines that survive a kill.

    ``open`` takes an exclusive lock (two batches on one output would run items twice), drops a
    partial last line left by a kill mid-write, and reads the ids already there.
    """

    def __init__(self, path: Path, *, fsync_interval_s: float = FSYNC_INTERVAL_S) -> None:
        self.path = path
        self.done: dict[str, str] = {}
        self.truncated_bytes = 0
        self.unreadable_lines: list[int] = []
        self._fsync_interval_s = fsync_interval_s
        self._fd: int | None = None
        self._last_sync = 0.0

    @classmethod
    def open(cls, path: Path, *, fsync_interval_s: float = FSYNC_INTERVAL_S) -> ResultLog:
        results = cls(path, fsync_interval_s=fsync_interval_s)
        fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                raise OutputBusyError(
                    f"another toolq batch is writing {path}; wait for it or stop it first"
                ) from None
            results.truncated_bytes = truncate_partial_line(fd)
            results.done, results.unreadable_lines = read_done(path)
        except BaseException:
            os.close(fd)
            raise
        results._fd = fd
        results._last_sync = time.monotonic()
        return results

    def append(self, record: Mapping[str, Any]) -> None:
        """Write one record as one line, in one system call, so no reader sees half of it."""
        if self._fd is None:
            raise ValueError(f"{self.path} is not open")
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode()
        written = os.write(self._fd, line)
        while written < len(line):  # only a full disk or a quota stops a file write short
            written += os.write(self._fd, line[written:])
        self.done[str(record["id"])] = str(record["status"])
        now = time.monotonic()
        if now - self._last_sync >= self._fsync_interval_s:
            os.fsync(self._fd)
            self._last_sync = now

    def close(self) -> None:
        if self._fd is not None:
            fd, self._fd = self._fd, None
            try:
                os.fsync(fd)
            finally:
                os.close(fd)

    def __enter__(self) -> ResultLog:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


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


def read_done(path: Path) -> tuple[dict[str, str], list[int]]:
    """Ids in the output with their status, and the numbers of lines that are not records."""
    done: dict[str, str] = {}
    unreadable: list[int] = []
    for number, raw in numbered_lines(path):
        try:
            record = json.loads(raw)
            done[str(record["id"])] = str(record.get("status", "error"))
        except (ValueError, TypeError, KeyError):
            unreadable.append(number)
    return done, unreadable
