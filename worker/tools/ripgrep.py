"""A literal search's first pass: which files of a tree hold the text at all, found by ripgrep.

ripgrep (the ``rg`` of the ``ripgrep`` wheel) reads a tree of thousands of files several times
faster than Python can. Its answer only narrows which files search_text opens: every line shown
still comes from the workspace's own reads, each path opened one component at a time without
following links. A file swapped for a link while ``rg`` ran is passed over as in any walk, so
nothing outside the workspace reaches an answer, whatever ``rg`` itself read.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sysconfig
from pathlib import Path

from worker.sandbox.config import SAFE_PATH

#: Address space ``rg`` may use: a huge file with no line end makes it hold the whole line,
#: and past this it fails, so the caller walks the tree itself, reading lines in pieces.
MEMORY_LIMIT_BYTES = 1 << 30

#: Texts ripgrep cannot be asked for as one literal line, or whose bytes do not say what
#: search_text's decoded lines hold: line ends, NUL, and the replacement character that stands
#: for undecodable bytes.
_NOT_A_PLAIN_LITERAL = ("\n", "\r", "\x00", "\ufffd")

_ARGUMENTS = (
    "--no-config",  # RIPGREP_CONFIG_PATH on the worker must not change what a search finds
    "--files-with-matches",
    "--null",
    "--hidden",
    "--no-ignore",  # the workspace's .gitignore files do not hide files from the model
    # Binary files are searched too, NUL bytes read as line ends: a file of zeros stays short
    # lines, and a binary file that holds the text is listed, so the answer can count it.
    "--binary",
    "--encoding=none",  # bytes as they are, as search_text reads them
    "--no-messages",
    "--fixed-strings",
)


@functools.cache
def ripgrep_command() -> tuple[str, ...] | None:
    """``rg`` (the ``ripgrep`` wheel's, beside this Python, else one on PATH) under util-linux's
    ``prlimit`` with its memory limit; None where either is missing."""
    beside = Path(sysconfig.get_path("scripts")) / "rg"
    ripgrep = str(beside) if os.access(beside, os.X_OK) else shutil.which("rg")
    prlimit = shutil.which("prlimit", path=SAFE_PATH)
    if ripgrep is None or prlimit is None:
        return None
    return (prlimit, f"--as={MEMORY_LIMIT_BYTES}", "--", ripgrep)


def files_holding(text: str, top: Path, timeout_s: float) -> list[str] | None:
    """Paths, relative to the directory ``top``, of the regular files below it (links not
    followed) whose bytes hold ``text``, in the order a top-down walk with sorted names meets
    them: a directory's files before its subdirectories'.

    None when ripgrep cannot answer exactly (not installed, ``text`` not a plain literal, an
    unreadable file on the way, its memory limit reached): the caller walks the tree itself. Raises
    ``subprocess.TimeoutExpired`` when ``rg`` needs longer than ``timeout_s``; it is killed.
    """
    command = ripgrep_command()
    if command is None or any(mark in text for mark in _NOT_A_PLAIN_LITERAL):
        return None
    argv = [*command, *_ARGUMENTS, "--", text, str(top)]
    done = subprocess.run(argv, capture_output=True, timeout=timeout_s, check=False)
    if done.returncode not in (0, 1):
        return None  # 2: something was not read, so a file with a match may be missing
    prefix = os.fsencode(top) + b"/"
    listed = [
        os.fsdecode(path.removeprefix(prefix))
        for path in done.stdout.split(b"\0")
        if path.startswith(prefix)
    ]
    return sorted(listed, key=_walk_order)


def _walk_order(relative: str) -> tuple[tuple[int, str], ...]:
    # A file sorts before any directory at the same depth, names in code point order.
    *directories, name = relative.split("/")
    return (*((1, directory) for directory in directories), (0, name))
