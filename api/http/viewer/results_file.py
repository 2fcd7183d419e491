"""A batch's results file as a batch of the viewer, read lazily (``toolq view OUTPUT.jsonl``).

Nothing waits for the whole file: the first page of results is read straight from the file's
start, while a background thread indexes it once, line by line (each line's offset and its
summary), for filters, sorting and later pages. The index then follows the file as it grows, so
the output of a batch still running can be watched.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
import time
from array import array
from pathlib import Path
from typing import Any

from api.batch.record import BatchRecord
from api.batch.summary import UNREADABLE, ItemSummary
from api.exceptions import NotABatchRecord
from api.http.viewer.sources import BatchView
from api.state.listing import Listed, ListQuery

#: Bytes read at a time while indexing.
CHUNK_BYTES = 1 << 20
#: A file written to this recently is taken to be the output of a batch still running.
GROWING_S = 60.0


class ResultsFile:
    """The file and its index: where each result line starts, and its summary."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offsets = array("q")
        self._line_numbers = array("q")
        self._summaries: list[ItemSummary] = []
        #: Where each id's line is in the index: a later line of the same id (an item run again,
        #: ``toolq batch --retry-errors``) takes its place, as for every reader of the file.
        self._position: dict[str, int] = {}
        self.ok = 0
        self.errors = 0
        self.scored = 0
        self.passed = 0
        #: The end of the last whole line indexed, and how many lines (blank ones too) it holds.
        self.indexed_bytes = 0
        self._lines = 0
        self._lock = threading.Lock()
        self._indexed = threading.Event()
        self._closing = threading.Event()

    # -- reading without the index -----------------------------------------------------------------

    def head(self, count: int) -> list[ItemSummary]:
        """The first ``count`` results, read from the start of the file."""
        found: list[ItemSummary] = []
        with self.path.open("rb") as file:
            for number, line in enumerate(file, start=1):
                if len(found) >= count:
                    break
                if line.strip() and line.endswith(b"\n"):
                    found.append(_summary(line, number))
        return found

    # -- the index -----------------------------------------------------------------------------

    @property
    def count(self) -> int:
        return len(self._summaries)

    @property
    def reading(self) -> bool:
        return not self._indexed.is_set()

    def index(self) -> None:
        """Index what was added since the last call, up to the last whole line."""
        with self._lock:
            self._indexed.clear()
            try:
                self._index_from(self.indexed_bytes)
            finally:
                self._indexed.set()

    def close(self) -> None:
        """Stop indexing at the next chunk: a server stopping does not read the file to its end."""
        self._closing.set()

    def summaries(self, start: int, count: int) -> list[ItemSummary]:
        return self._summaries[start : start + count]

    def all_summaries(self) -> list[ItemSummary]:
        return list(self._summaries)

    def record(self, index: int) -> dict[str, Any] | None:
        """The whole record at ``index`` (0 = the first line), read at its offset."""
        if not 0 <= index < len(self._offsets):
            return None
        with self.path.open("rb") as file:
            file.seek(self._offsets[index])
            line = file.readline()
        number = self._line_numbers[index]
        try:
            record = json.loads(line)
        except ValueError as exc:
            return _unreadable_record(number, f"not JSON: {exc}", line)
        if not isinstance(record, dict):
            return _unreadable_record(number, "not a JSON object", line)
        try:
            BatchRecord.read(record)
        except NotABatchRecord as exc:
            return _unreadable_record(number, str(exc), line)
        return record

    def _index_from(self, position: int) -> None:
        pending = b""
        with self.path.open("rb") as file:
            file.seek(position)
            while not self._closing.is_set() and (chunk := file.read(CHUNK_BYTES)):
                data = pending + chunk
                start = 0
                while (end := data.find(b"\n", start)) != -1:
                    self._lines += 1
                    if data[start:end].strip():
                        self._add(position + start, data[start : end + 1])
                    start = end + 1
                position += start
                pending = data[start:]
                self.indexed_bytes = position

    def _add(self, offset: int, line: bytes) -> None:
        summary = _summary(line, self._lines)
        self._count(summary, 1)
        earlier = self._position.get(summary.id)
        if earlier is not None:
            self._count(self._summaries[earlier], -1)
            self._offsets[earlier] = offset
            self._line_numbers[earlier] = self._lines
            self._summaries[earlier] = summary
            return
        self._position[summary.id] = len(self._summaries)
        self._offsets.append(offset)
        self._line_numbers.append(self._lines)
        self._summaries.append(summary)

    def _count(self, summary: ItemSummary, sign: int) -> None:
        self.ok += sign * (summary.status == "ok")
        self.errors += sign * (summary.status != "ok")
        if summary.passed is not None:
            self.scored += sign
            self.passed += sign * summary.passed


def _summary(line: bytes, number: int) -> ItemSummary:
    try:
        record = json.loads(line)
    except ValueError as exc:
        return ItemSummary.unreadable(f"line {number}", f"not JSON: {exc}")
    if not isinstance(record, dict):
        return ItemSummary.unreadable(f"line {number}", "not a JSON object")
    return ItemSummary.read(record, f"line {number}")


def _unreadable_record(number: int, reason: str, line: bytes) -> dict[str, Any]:
    return {
        "id": f"line {number}",
        "status": UNREADABLE,
        "error": f"line {number} is {reason}",
        "line": line.decode("utf-8", "replace"),
    }


class ResultsFileSource:
    """One results file as the viewer's only batch, named after the file."""

    def __init__(self, path: Path) -> None:
        self.file = ResultsFile(path)
        self.batch_id = path.name
        self._indexing: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Index what the file gained, in the background (pages are answered meanwhile), unless
        indexing is already under way."""
        if self._indexing is None or self._indexing.done():
            self._indexing = asyncio.get_running_loop().create_task(
                asyncio.to_thread(self.file.index)
            )

    async def close(self) -> None:
        self.file.close()
        if self._indexing is not None:
            await self._indexing

    async def _indexed(self) -> None:
        """Until every whole line the file had when asked is indexed."""
        # A pass under way may have begun before the file last grew: then one more is needed.
        # Shielded: a reader who gives up does not stop the index everyone shares.
        if self._indexing is not None and not self._indexing.done():
            await asyncio.shield(self._indexing)
        if self.file.indexed_bytes < self.file.path.stat().st_size:
            self.start()
            assert self._indexing is not None
            await asyncio.shield(self._indexing)

    async def batches(self, query: ListQuery) -> Listed[BatchView]:
        """The file's one batch, whatever the filters: it has none of a server's statuses."""
        batch = await self.batch(self.batch_id)
        found = [batch] if batch is not None else []
        return Listed(found, len(found), 0, None)

    async def batch(self, batch_id: str) -> BatchView | None:
        if batch_id != self.batch_id:
            return None
        file = self.file
        info = file.path.stat()  # one look at the file for its size, its growth and its end
        size = info.st_size
        if not file.reading and file.indexed_bytes < size:
            self.start()
        growing = time.time() - info.st_mtime < GROWING_S
        if file.reading:
            shown = f"{file.indexed_bytes / size:.0%}" if size else "0%"
            status, note = "reading", f"Reading the file: {file.count:,} results so far ({shown})."
        elif growing:
            status, note = "growing", "The file was written to in the last minute."
        else:
            status, note = "read", None
        return BatchView(
            id=self.batch_id,
            title=file.path.name,
            status=status,
            live=file.reading or growing,
            total=None,
            done=file.count,
            ok=file.ok,
            error=file.errors,
            scored=file.scored,
            passed=file.passed,
            finished_at=info.st_mtime,
            note=note,
        )

    async def summaries(self, batch_id: str, start: int, count: int) -> list[ItemSummary]:
        if start + count > self.file.count and self.file.reading:
            if start == 0:  # the first page: straight from the file, never after the index
                return await asyncio.to_thread(self.file.head, count)
            await self._indexed()
        return self.file.summaries(start, count)

    async def all_summaries(self, batch_id: str) -> list[ItemSummary]:
        await self._indexed()
        return self.file.all_summaries()

    async def record(self, batch_id: str, index: int) -> dict[str, Any] | None:
        if batch_id != self.batch_id:
            return None
        if index >= self.file.count:
            await self._indexed()
        return await asyncio.to_thread(self.file.record, index)


def results_path_problem(path: Path) -> str | None:
    """Why ``path`` cannot be viewed, or None."""
    if not path.exists():
        return f"{path}: no such file"
    if not path.is_file():
        return f"{path}: not a file"
    if not os.access(path, os.R_OK):
        return f"{path}: not readable"
    return None
