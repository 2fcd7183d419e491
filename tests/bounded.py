"""Bounded reads from a child process: a test that waits on one fails naming what it waited for,
instead of hanging until the per-test timeout."""

from __future__ import annotations

import queue
import subprocess
import threading
from typing import IO, AnyStr


def read_line(proc: subprocess.Popen[AnyStr], what: str, timeout: float = 60) -> AnyStr:
    """The next line ``proc`` writes to its stdout; fails naming ``what`` if none comes within
    ``timeout`` seconds or the process closes its stdout first."""
    pipe = proc.stdout
    assert pipe is not None, f"the stdout of {proc.args!r} is not a pipe"
    # A thread does the read: a selector would miss a line the reader has already buffered. If
    # the bound passes, the thread ends when the test's cleanup ends the process.
    lines: queue.Queue[AnyStr] = queue.Queue()
    threading.Thread(target=_read_into, args=(pipe, lines), daemon=True).start()
    try:
        line = lines.get(timeout=timeout)
    except queue.Empty:
        raise AssertionError(f"timed out after {timeout}s waiting for {what}") from None
    if not line:
        raise AssertionError(f"{proc.args!r} closed its stdout before {what}")
    return line


def _read_into(pipe: IO[AnyStr], lines: queue.Queue[AnyStr]) -> None:
    lines.put(pipe.readline())
