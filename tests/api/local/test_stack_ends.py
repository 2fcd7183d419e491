"""A local stack ends with the process that owns it, however that process ends: its Redis and
workers die with it (a parent-death signal), and what a killed stack left anyway is ended by the
next stack to start."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from api.local.leftovers import FOLDER_PREFIX, RECORD, StackRecord
from api.local.processes import is_running, kill_all, stamp, this_machine
from api.local.stack import LocalStack, free_port, redis_server_argv
from tests.conftest import fleet_settings, wait_for, wait_for_file
from tests.e2e.commands import clean_env

pytestmark = pytest.mark.integration

#: Opens a local stack from a thread that then ends, as the worker threads of asyncio and anyio
#: do (Inspect's task_init runs on one), writes the pids of its processes to argv[1], and waits.
OPENS_A_STACK = """
import json, sys, threading
from pathlib import Path
from api.local.stack import LocalStack
from worker.contract.settings import WorkerSettings

def open_stack():
    opened["stack"] = LocalStack(WorkerSettings()).__enter__()

opened = {}
thread = threading.Thread(target=open_stack)
thread.start()
thread.join()
stack = opened["stack"]
pids = [pid for name in ("redis", "worker-tools", "worker-sandbox") for pid in stack.pids(name)]
partial = Path(sys.argv[1] + ".partial")
partial.write_text(json.dumps(pids))
partial.rename(sys.argv[1])
threading.Event().wait()
"""


def test_a_stack_whose_process_is_killed_leaves_nothing_running(tmp_path: Path) -> None:
    ready = tmp_path / "pids.json"
    env = clean_env() | {
        "TOOLQ_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
        "TMPDIR": str(tmp_path),  # the stack's folder, and the leftovers it looks for
    }
    log = tmp_path / "owner.log"
    with log.open("wb") as output:
        owner = subprocess.Popen(
            [sys.executable, "-c", OPENS_A_STACK, str(ready)],
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    stamps = []
    try:
        wait_for_file(ready, owner, log, "the local stack to start")
        pids = json.loads(ready.read_text())
        stamps = [stamp(pid) for pid in pids]
        # Redis and both workers (with their pool processes), running after the thread that
        # started them ended.
        assert len(stamps) >= 3 and None not in stamps, pids
        owner.kill()
        owner.wait(timeout=30)
        wait_for(
            lambda: not any(s is not None and is_running(s) for s in stamps),
            timeout=60,
            what="the stack's Redis and workers to die with their owner",
        )
    finally:
        if owner.poll() is None:
            owner.kill()
            owner.wait(timeout=30)
        kill_all([s for s in stamps if s is not None])


def test_the_next_stack_ends_what_a_killed_one_left(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    killed = tmp_path / f"{FOLDER_PREFIX}killed"
    killed.mkdir()
    # A redis-server without a parent-death signal, recorded by a stack whose process is gone.
    left = subprocess.Popen(
        redis_server_argv(free_port(), killed),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    gone = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=-1)
    gone_stamp, left_stamp = stamp(gone.pid), stamp(left.pid)
    assert gone.stdin is not None and gone_stamp is not None and left_stamp is not None
    gone.stdin.close()
    gone.wait(timeout=30)
    here = this_machine()
    record = StackRecord(machine=here, owner=gone_stamp, children={"redis": left_stamp})
    (killed / RECORD).write_text(record.model_dump_json())
    # A stack of a process that still runs (this one) keeps its folder.
    running = tmp_path / f"{FOLDER_PREFIX}running"
    running.mkdir()
    alive = StackRecord(machine=here, owner=stamp(os.getpid()) or gone_stamp)
    (running / RECORD).write_text(alive.model_dump_json())
    stack = LocalStack(fleet_settings("redis://127.0.0.1:1/0", tmp_path / "workspaces"))
    try:
        assert left.wait(timeout=60) == -signal.SIGKILL
        assert not killed.exists()
        assert running.exists()
    finally:
        stack.stop()
        if left.poll() is None:
            left.kill()
            left.wait(timeout=30)
