"""The boundaries of the box hold for a session as for run_bash's commands, tried as an attacker
would: a run's session runs as its run's uid, sees nothing of another run's session (its
processes, its terminal, its holder's socket), and nothing of a session is left once its run
ends (processes, holder, files, mounts)."""

from __future__ import annotations

import re
import uuid

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, WorkerFleet, wait_for
from tests.worker.sessions.helpers import (
    alive,
    holder_pids,
    mounts_naming,
    processes_with,
    run_sessions,
    session,
    token,
)
from worker.contract.operations import REMOVE_WORKSPACE
from worker.contract.run_limits import RunLimits

pytestmark = pytest.mark.integration


async def test_a_runs_session_cannot_reach_another_runs(fleet: WorkerFleet) -> None:
    async with Dispatcher(fleet.settings) as dispatcher:
        victim = Caller(dispatcher, fleet.settings, f"run-{uuid.uuid4().hex[:12]}")
        attacker = Caller(dispatcher, fleet.settings, f"run-{uuid.uuid4().hex[:12]}")
        mark = token()
        own = await session(
            victim, "type_submit", f"export SECRET=s3cret; sleep {mark} & tty; id -u"
        )
        terminal, victim_uid = own["output"].splitlines()[-2:]
        assert terminal.startswith("/dev/pts/")
        sessions_folder = run_sessions(fleet.settings, victim.run_id).folder

        tries = await session(
            attacker,
            "type_submit",
            "id -u; "
            f"pgrep -f {mark} || echo no-process; "
            f"{{ echo typed > {terminal}; }} 2>/dev/null || echo no-terminal; "
            f"ls {sessions_folder} 2>/dev/null || echo no-sockets; "
            f"ls {sessions_folder.parent} 2>/dev/null || echo no-folder; "
            f"kill -9 -1 2>/dev/null; grep -l s3cret /proc/*/environ 2>/dev/null || echo no-env",
        )

        lines = tries["output"].splitlines()
        assert lines[0] != victim_uid
        assert lines[1:] == ["no-process", "no-terminal", "no-sockets", "no-folder", "no-env"]
        # The victim's shell and its job are as they were, and saw nothing typed.
        assert processes_with(f"sleep {mark}")
        after = await session(victim, "type_submit", "echo $SECRET")
        assert after["output"] == "s3cret\n"


async def test_nothing_of_a_session_is_left_once_its_run_ends(call: Caller) -> None:
    mark = token()
    await session(
        call, "type_submit", f"sleep {mark} & python3 -c 'import time; time.sleep({mark})' &"
    )
    await session(call, "type_submit", f"sleep {mark}1 &", session="other")
    holders = holder_pids(call.settings, call.run_id)
    assert len(holders) == 2 and all(alive(pid) for pid in holders)
    assert len(processes_with(mark)) >= 3

    removed = await call(REMOVE_WORKSPACE.name, {})

    assert not removed.is_error, removed.output
    wait_for(lambda: not processes_with(mark), 15, "the sessions' processes to end")
    wait_for(lambda: not any(alive(pid) for pid in holders), 15, "the holders to end")
    assert not run_sessions(call.settings, call.run_id).folder.exists()
    assert mounts_naming(call.run_id) == []


async def test_a_session_runs_as_its_runs_uid_with_run_bash(call: Caller) -> None:
    shell = await session(call, "type_submit", "id -u; echo $HOME")
    command = await call("run_bash", {"command": "id -u; echo $HOME"})

    import json

    assert shell["output"] == json.loads(command.output)["stdout"]
    assert shell["output"].splitlines()[0] != "0"


async def test_a_session_holds_its_runs_process_limit(fleet: WorkerFleet) -> None:
    async with Dispatcher(fleet.settings) as dispatcher:
        run_id = f"run-{uuid.uuid4().hex[:12]}"
        dispatcher.limits[run_id] = RunLimits(pids=8)
        call = Caller(dispatcher, fleet.settings, run_id)

        bomb = await session(call, "type_submit", "for i in $(seq 30); do sleep 5 & done")
        await session(call, "interrupt")  # bash retries a fork that failed, for a while
        after = await session(call, "type_submit", "kill $(jobs -p) 2>/dev/null; wait; echo alive")

    started = re.findall(r"^\[\d+\] \d+$", bomb["output"], re.MULTILINE)
    assert "fork" in bomb["output"] and "Resource temporarily unavailable" in bomb["output"]
    assert 0 < len(started) < 8, bomb["output"]  # the shell is one of the run's 8
    assert "alive" in after["output"]
