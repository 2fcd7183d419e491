"""A call's teardown ends within its bound, whatever its processes do: one whose reaper never
reaps it (a spawner that died, an init that does not wait) no longer holds the call."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from tests.bounded import read_line
from tests.conftest import wait_for
from tests.worker.conftest import one_uid
from worker.sandbox import ending as ending_module
from worker.sandbox.config import SandboxConfig
from worker.sandbox.ending import Ending
from worker.sandbox.layers import plan_for
from worker.sandbox.output import CappedStream
from worker.sandbox.start.spawner_client import SpawnedProcess

#: A parent that forks a child which exits at once, says its pid, and never reaps it.
_NEVER_REAPS = (
    "import os, sys\n"
    "child = os.fork()\n"
    "if child == 0:\n"
    "    os._exit(3)\n"
    "print(child, flush=True)\n"
    "sys.stdin.read()\n"
)
BOUND_S = 0.5


@pytest.fixture
def unreaped() -> Iterator[int]:
    """The pid of a process that has exited and that its parent (not us) never reaps."""
    parent = subprocess.Popen(
        [sys.executable, "-c", _NEVER_REAPS],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
    )
    assert parent.stdout is not None and parent.stdin is not None
    try:
        yield int(read_line(parent, "the parent to print its unreaped child's pid"))
    finally:
        parent.stdin.close()
        parent.stdout.close()
        parent.wait(30)


def test_a_call_whose_process_is_never_reaped_ends_at_the_bound(
    unreaped: int, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(ending_module, "REAP_BOUND_S", BOUND_S)
    out_read, out_write = os.pipe()
    err_read, err_write = os.pipe()
    os.close(out_write)
    os.close(err_write)
    # As a spawned launch looks to the worker: not its child, followed through a pidfd.
    proc = SpawnedProcess(unreaped, out_read, err_read)
    plan = plan_for(
        SandboxConfig(one_uid(isolation="process", cgroup="off")),
        os.geteuid(),
    )
    ending = Ending(proc, plan, marker="", group=None, init_socket=None)
    assert proc.stderr is not None
    stderr = CappedStream(proc.stderr, 1024)
    answers: list[int | None] = []
    reaping = threading.Thread(target=lambda: answers.append(ending.reap(stderr)), daemon=True)

    with caplog.at_level(logging.WARNING, logger=ending_module.__name__):
        reaping.start()
        wait_for(lambda: not reaping.is_alive(), timeout=BOUND_S * 20, what="the reap to end")

    assert answers == [None]
    assert f"process {unreaped} was not reaped" in caplog.text
    proc.close()
    for stream in (proc.stdout, proc.stderr):
        assert stream is not None
        stream.close()
