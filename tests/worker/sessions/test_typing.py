"""What a call types reaches the session's terminal, whatever time its wait has left."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator

import pytest

from worker.sessions.shell import TYPE_CHUNK, type_into


@pytest.fixture
def terminal() -> Iterator[tuple[int, int]]:
    """A terminal's two ends: the holder's, and the shell's."""
    holders, shells = os.openpty()
    yield holders, shells
    os.close(holders)
    os.close(shells)


def test_what_is_typed_after_the_wait_is_over_still_reaches_the_shell(
    terminal: tuple[int, int],
) -> None:
    """A call whose wait the shell's start used up (a loaded machine) still types its command."""
    holders, shells = terminal
    line = b"sleep 1000.5 # " + b"x" * TYPE_CHUNK + b"\n"  # more than one write

    left = type_into(holders, line, deadline=time.monotonic() - 1)

    assert left == 0
    assert os.read(shells, 4096) == line
