"""Globs matched one name at a time as a walk of a workspace meets them: ``search_files`` finds
names with them, and the service operations choose the files they collect."""

from __future__ import annotations

import fnmatch
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from worker.contract.wire import glob_segments
from worker.exceptions import SearchTimeUp, WorkspaceError
from worker.tools import paths
from worker.tools.workspace import Workspace


@dataclass(frozen=True)
class Glob:
    """A glob matched one name at a time, as a walk meets them.

    A state is the index of the next segment to match; ``**`` may match no name, so a state
    on it also stands for the one after it.
    """

    segments: tuple[str, ...]
    dirs_only: bool

    @classmethod
    def parse(cls, pattern: str) -> Glob:
        try:
            segments = glob_segments(pattern)
        except ValueError as exc:
            raise WorkspaceError(f"the pattern {paths.shown(pattern)} {exc}") from None
        return cls(segments, dirs_only=pattern.endswith("/"))

    def start(self) -> frozenset[int]:
        return self._closure({0})

    def step(self, states: frozenset[int], name: str) -> tuple[bool, frozenset[int]]:
        """Whether ``name`` (in a directory reached in ``states``) matches the whole pattern,
        and the states of the names below it."""
        last = len(self.segments) - 1
        matched = False
        below: set[int] = set()
        for index in states:
            segment = self.segments[index]
            if segment == "**":
                below.add(index)
                matched = matched or index == last
            elif name == segment if _is_literal(segment) else fnmatch.fnmatchcase(name, segment):
                if index == last:
                    matched = True
                else:
                    below.add(index + 1)
        return matched, self._closure(below)

    def _closure(self, states: set[int]) -> frozenset[int]:
        closed = set(states)
        for index in states:
            while self.segments[index] == "**" and index + 1 < len(self.segments):
                index += 1
                closed.add(index)
        return frozenset(closed)


def glob_walk(
    workspace: Workspace, base: Path, globs: list[Glob], deadline: float | None = None
) -> Iterator[tuple[str, int, str, bool]]:
    """The entries below ``base`` that one of ``globs`` matches, as a walk meets them: the
    directory holding each (relative to ``base``) and its descriptor, its name, and whether it
    is a directory. Only directories the rest of a pattern can match are entered; past
    ``deadline`` (``time.monotonic``) the walk raises ``SearchTimeUp``."""
    states = {"": [glob.start() for glob in globs]}
    for rel, fd, dirs, files in workspace.walk(base):
        if deadline is not None and time.monotonic() > deadline:
            raise SearchTimeUp
        here = states.pop(rel)
        entered: list[str] = []
        for name in dirs:
            steps = [glob.step(state, name) for glob, state in zip(globs, here, strict=True)]
            if any(matched for matched, _ in steps):
                yield rel, fd, name, True
            below = [states_below for _, states_below in steps]
            if any(below):
                entered.append(name)
                states[os.path.join(rel, name)] = below
        dirs[:] = entered
        for name in files:
            if any(glob.step(state, name)[0] for glob, state in zip(globs, here, strict=True)):
                yield rel, fd, name, False


def _is_literal(segment: str) -> bool:
    # A name without wildcards is compared as is: compiling it as a pattern costs far more.
    return not any(char in segment for char in "*?[")
