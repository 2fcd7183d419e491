"""Killing what a sweep finds, and counting it: real processes, signalled through pidfds."""

from __future__ import annotations

import signal
import subprocess
import time

from worker.sandbox.pidfd_kill import kill_until_gone


def test_a_process_found_again_as_it_dies_is_counted_once() -> None:
    """On a loaded machine a killed process is still listed at the next look, and signalled
    again: the sweep says it killed one process, not two."""
    proc = subprocess.Popen(["sleep", "1000"])
    looks = iter([[proc.pid], [proc.pid]])  # the second look comes before the kernel ended it

    killed = kill_until_gone(lambda: next(looks, []), lambda _: True, time.monotonic() + 10)

    assert killed == 1
    assert proc.wait(10) == -signal.SIGKILL


def test_a_process_no_longer_the_one_is_neither_killed_nor_counted() -> None:
    proc = subprocess.Popen(["sleep", "1000"])
    looks = iter([[proc.pid]])
    try:
        killed = kill_until_gone(lambda: next(looks, []), lambda _: False, time.monotonic() + 10)
        assert killed == 0
        assert proc.poll() is None
    finally:
        proc.kill()
        proc.wait(10)
