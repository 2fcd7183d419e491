"""Waiting for a lock file: taken when free, given up at the deadline when another holds it."""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.images.locks import lock_by


@pytest.fixture
def lock_file(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """Two descriptors of one lock file, as two processes would each open it."""
    path = tmp_path / "lock"
    first = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    second = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    yield first, second
    os.close(first)
    os.close(second)


def test_a_free_lock_is_taken(lock_file: tuple[int, int]) -> None:
    first, _ = lock_file
    assert lock_by(first, time.monotonic() + 1, 0.01)


def test_a_held_lock_is_given_up_at_the_deadline(lock_file: tuple[int, int]) -> None:
    first, second = lock_file
    fcntl.flock(first, fcntl.LOCK_EX)
    started = time.monotonic()
    assert not lock_by(second, started + 0.1, 0.01)
    assert time.monotonic() - started >= 0.1


def test_a_released_lock_is_taken_even_at_its_deadline(lock_file: tuple[int, int]) -> None:
    first, second = lock_file
    fcntl.flock(first, fcntl.LOCK_EX)
    fcntl.flock(first, fcntl.LOCK_UN)
    assert lock_by(second, time.monotonic(), 0.01)
