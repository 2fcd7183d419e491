"""Search tools: lines of text that match, and paths that match a glob, inside the workspace."""

from __future__ import annotations

import itertools
import os
import stat
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import regex
from pydantic import Field, field_validator

from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, answer_budget
from worker.exceptions import PathNotFoundError, SearchTimeUp, WorkspaceError
from worker.tools import paths
from worker.tools.filesystem import BINARY_PROBE_BYTES, WorkspaceTool
from worker.tools.globs import Glob, glob_walk
from worker.tools.interface import ToolArgs, TruncatedText
from worker.tools.ripgrep import files_holding
from worker.tools.workspace import Workspace

#: A whole search, however many files, gets this long before it answers with what it has.
DEFAULT_TIME_BUDGET_S = 5.0
#: Longest piece of a line read at once: a file without newlines must not fill memory.
MAX_LINE_BYTES = 1 << 20
#: Longest line shown in a match; the rest is cut.
MAX_SHOWN_LINE_CHARS = 500


@dataclass
class _Collected:
    """Results kept within the output cap, and how many did not fit."""

    budget: int
    lines: list[str] = field(default_factory=list)
    left_out: int = 0

    def add(self, line: str) -> None:
        size = len(line.encode("utf-8", "surrogatepass")) + 1
        if self.left_out or size > self.budget:
            self.left_out += 1
            return
        self.budget -= size
        self.lines.append(line)

    def answer(self, notes: list[str]) -> str:
        """The lines kept, then ``notes``; marked truncated when some did not fit."""
        text = "\n".join([*self.lines, *notes])
        return TruncatedText(text) if self.left_out else text


def _remaining(deadline: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise SearchTimeUp
    return left


class SearchTool(WorkspaceTool):
    """A search of the workspace: it answers within the output cap and its time budget, with
    notes of what did not fit and of a search cut short."""

    idempotent = True

    def __init__(
        self,
        workspace: Workspace,
        *,
        output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES,
        time_budget_s: float = DEFAULT_TIME_BUDGET_S,
    ) -> None:
        super().__init__(workspace, output_cap_bytes=output_cap_bytes)
        self.time_budget_s = time_budget_s

    def _collect(self) -> _Collected:
        return _Collected(answer_budget(self.output_cap_bytes))

    def _left_out_note(self, left_out: str, advice: str) -> str:
        return (
            f"[{left_out} not shown: the answer is capped at {self.output_cap_bytes:,} bytes. "
            f"{advice}]"
        )

    def _time_up_note(self, advice: str) -> str:
        return (
            f"[search stopped after its {self.time_budget_s:g} s time limit; results are "
            f"incomplete. {advice}]"
        )


# -- search_text -------------------------------------------------------------------------------


class SearchTextArgs(ToolArgs):
    query: str = Field(min_length=1, description="The text (or regular expression) to find.")
    paths: list[str] = Field(
        min_length=1,
        description="Files or directories to search, relative to the workspace, e.g. ['.'] "
        "for everything; directories are searched recursively. A single path string is "
        "accepted too.",
    )
    regex: bool = Field(
        False, description="Treat the query as a regular expression instead of literal text."
    )

    @field_validator("paths", mode="before")
    @classmethod
    def _one_path_is_a_list(cls, value: object) -> object:
        return [value] if isinstance(value, str) else value


LineMatcher = Callable[[str, float], bool]


class SearchTextTool(SearchTool):
    name = "search_text"
    description = (
        "Search files in the workspace line by line for text or a regular expression. Answers "
        "with 'path:line_number:line' for each matching line; binary files are skipped."
    )
    Args = SearchTextArgs

    def execute(self, args: dict[str, Any]) -> str:
        query: str = args["query"]
        matches = _line_matcher(query, args["regex"])
        resolved = (self.workspace.resolve(p) for p in dict.fromkeys(args["paths"]))
        targets = list(dict.fromkeys(resolved))
        deadline = time.monotonic() + self.time_budget_s
        found = self._collect()
        literal = None if args["regex"] else query
        search = _TextSearch(self.workspace, matches, found, deadline, literal)
        problems: list[str] = []
        timed_out = False
        for target in targets:
            try:
                search.path(target)
            except WorkspaceError as exc:
                problems.append(str(exc))
            except SearchTimeUp:
                timed_out = True
                break
        if len(problems) == len(targets):
            raise WorkspaceError("; ".join(problems))
        notes = [f"[not searched: {problem}]" for problem in problems]
        if search.binary_skipped:
            notes.append(f"[{paths.counted(search.binary_skipped, 'binary file')} skipped]")
        if found.left_out:
            more = "at least " if timed_out else ""
            left_out = more + paths.counted(found.left_out, "more match", "more matches")
            notes.append(self._left_out_note(left_out, "Narrow the search."))
        if timed_out:
            notes.append(self._time_up_note("Search fewer files or use a simpler pattern."))
        if not found.lines and not found.left_out:
            what = "the regular expression" if args["regex"] else "the text"
            where = ", ".join(paths.shown(self.workspace.relative(t)) for t in targets)
            return "\n".join([f"No lines match {what} {paths.shown(query)} in {where}.", *notes])
        return found.answer(notes)


def _line_matcher(query: str, is_regex: bool) -> LineMatcher:
    if not is_regex:
        return lambda line, _timeout: query in line
    try:
        pattern = regex.compile(query)
    except (regex.error, OverflowError, RecursionError, ValueError) as exc:
        raise ValueError(f"invalid regular expression {paths.shown(query)}: {exc}") from None

    def search(line: str, timeout: float) -> bool:
        try:
            return pattern.search(line, timeout=timeout) is not None
        except TimeoutError:
            raise SearchTimeUp from None

    return search


@dataclass
class _TextSearch:
    """One search_text call walking its paths."""

    workspace: Workspace
    matches: LineMatcher
    found: _Collected
    deadline: float
    #: The query when it is plain text: ripgrep then picks the files of a tree worth reading.
    literal: str | None
    binary_skipped: int = 0

    def path(self, target: Path) -> None:
        info = self.workspace.lstat(target)
        where = self.workspace.relative(target)
        if info is None:
            raise PathNotFoundError(f"{paths.shown(where)} does not exist")
        if stat.S_ISDIR(info.st_mode):
            self.tree(target)
        elif stat.S_ISREG(info.st_mode):
            with self.workspace.parent(target) as (dir_fd, name):
                self.file(dir_fd, name, where)
        else:
            raise WorkspaceError(f"{paths.shown(where)} is {paths.file_kind(info.st_mode)}")

    def tree(self, top: Path) -> None:
        if self.literal is not None:
            try:
                holding = files_holding(self.literal, top, _remaining(self.deadline))
            except subprocess.TimeoutExpired:
                raise SearchTimeUp from None
            if holding is not None:
                self.listed(top, holding)
                return
        for rel, dir_fd, _dirs, files in self.workspace.walk(top):
            _remaining(self.deadline)
            for name in files:
                _remaining(self.deadline)
                where = self.workspace.relative(top / rel / name)
                try:
                    self.file(dir_fd, name, where)
                except WorkspaceError:
                    continue  # a link, pipe or device in a tree is passed over

    def listed(self, top: Path, relatives: list[str]) -> None:
        """Reads the files at ``relatives`` below ``top``, one directory opened for each run of
        files in it, passing over any that is no longer a regular file inside the workspace."""
        for folder, names in itertools.groupby(relatives, key=os.path.dirname):
            _remaining(self.deadline)
            try:
                with self.workspace.directory(top / folder) as dir_fd:
                    for relative in names:
                        path = top / relative
                        try:
                            self.file(dir_fd, path.name, self.workspace.relative(path))
                        except WorkspaceError:
                            continue
            except WorkspaceError:
                continue  # the directory went, or became a link, since ripgrep listed it

    def file(self, dir_fd: int, name: str, where: str) -> None:
        fd = self.workspace.open_regular_at(dir_fd, name, where)
        with os.fdopen(fd, "rb") as file:
            try:
                if b"\x00" in file.read(BINARY_PROBE_BYTES):
                    self.binary_skipped += 1
                    return
                file.seek(0)
                self.lines(file, where)
            except OSError as exc:
                raise self.workspace.error(exc, where) from None

    def lines(self, file: BinaryIO, where: str) -> None:
        number = 0
        line_ended = True
        while raw := file.readline(MAX_LINE_BYTES):
            if line_ended:
                number += 1
            line_ended = raw.endswith(b"\n")
            line = raw.decode("utf-8", "replace").rstrip("\r\n")
            if self.matches(line, _remaining(self.deadline)):
                if len(line) > MAX_SHOWN_LINE_CHARS:
                    line = line[:MAX_SHOWN_LINE_CHARS] + "…"
                self.found.add(f"{where}:{number}:{line}")


# -- search_files ------------------------------------------------------------------------------


class SearchFilesArgs(ToolArgs):
    pattern: str = Field(
        min_length=1,
        description="A glob relative to `path`: '*' and '?' match within one name, '[abc]' one "
        "of those characters, '**' any number of directories. E.g. '**/*.py', 'src/*.txt'; "
        "end it with '/' to match directories only.",
    )
    path: str = Field(".", description="The directory to search in, relative to the workspace.")


class SearchFilesTool(SearchTool):
    name = "search_files"
    description = (
        "Find files and directories in the workspace whose paths match a glob pattern such as "
        "'**/*.py'. Answers with matching paths relative to the workspace, sorted; "
        "directories end with '/'."
    )
    Args = SearchFilesArgs

    def execute(self, args: dict[str, Any]) -> str:
        pattern: str = args["pattern"]
        glob = Glob.parse(pattern)
        base = self.workspace.resolve(args["path"])
        deadline = time.monotonic() + self.time_budget_s
        hits: list[str] = []
        timed_out = False
        try:
            for rel, _fd, name, is_dir in glob_walk(self.workspace, base, [glob], deadline):
                if is_dir or not glob.dirs_only:
                    where = self.workspace.relative(base / rel / name)
                    hits.append(f"{where}/" if is_dir else where)
        except SearchTimeUp:
            timed_out = True
        return self._answer(sorted(hits), pattern, base, timed_out)

    def _answer(self, hits: list[str], pattern: str, base: Path, timed_out: bool) -> str:
        collected = self._collect()
        for hit in hits:
            collected.add(hit)
        notes: list[str] = []
        if collected.left_out:
            more = paths.counted(collected.left_out, "more path")
            notes.append(self._left_out_note(more, "Use a narrower pattern."))
        if timed_out:
            notes.append(self._time_up_note("Use a narrower pattern or path."))
        if not collected.lines and not collected.left_out:
            where = self.workspace.relative(base)
            line = f"No paths match {paths.shown(pattern)} in {paths.shown(where)}."
            if "/" not in pattern.rstrip("/") and not timed_out:
                line += f" ('*' stays in one directory: try '**/{paths.printable(pattern)}'.)"
            return "\n".join([line, *notes])
        return collected.answer(notes)
