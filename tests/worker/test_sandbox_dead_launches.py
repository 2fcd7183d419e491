"""Launches made ahead that are dead when a call comes: the call still runs, on a launch made
then; and a run's launches live where no call on the host had input yet."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.worker.conftest import run_in_workspace
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.sandbox import SandboxConfig, SandboxResult
from worker.sandbox import command as running
from worker.sandbox import plan as planning
from worker.sandbox.layers import plan_for
from worker.sandbox.pidfd import has_exited
from worker.sandbox.plan import Plan
from worker.sandbox.start.launch import Launch
from worker.sandbox.start.ready_pool import EACH_RUN, launcher
from worker.tools.factory import prepare_workspace
from worker.tools.workspace import Workspace

RANGE = UidRange.parse(DEFAULT_UID_RANGE)
#: How long a launch may take to be made, or its processes to be gone once killed.
BOUND_S = 10.0
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need a root worker")


@pytest.fixture
def taken(monkeypatch: pytest.MonkeyPatch) -> list[Launch]:
    """The launches calls take, in turn."""
    found: list[Launch] = []
    take = launcher.take

    def recorded(plan: Plan, config: SandboxConfig) -> Launch:
        found.append(take(plan, config))
        return found[-1]

    monkeypatch.setattr(launcher, "take", recorded)
    return found


def _workspace(config: SandboxConfig, name: str) -> Workspace:
    return prepare_workspace(Path(str(config.workspace_root)) / name, config)


def _run_plan(config: SandboxConfig, workspace: Workspace) -> Plan:
    """The plan of the launches made ahead for ``workspace``'s run alone, as a call makes it."""
    assert workspace.owner is not None
    plan = plan_for(config, os.geteuid())
    run_tmp = config.run_tmp_for(workspace.root, workspace.owner[1])
    # The run's uid has a name in its view: a call's plan binds those files too.
    uid, gid = workspace.owner
    names = config.run_names_for(workspace.root, uid, gid) if plan.namespaced else ()
    for_run = plan.for_run(workspace.owner, str(workspace.root), run_tmp, names)
    if for_run is None:
        pytest.skip("no launches are made ahead for one run here (no spawner)")
    return for_run


def _answers(result: SandboxResult, workspace: Workspace) -> None:
    """``result`` is that of ``echo ran; id -u`` run as ``workspace``'s run."""
    assert workspace.owner is not None
    assert (result.exit_code, result.stderr) == (0, "")
    assert result.stdout.split() == ["ran", str(workspace.owner[0])]


def test_a_runs_launches_live_though_no_call_had_input_yet(
    config: SandboxConfig, taken: list[Launch], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A host where no call had input yet: the folder of the inputs, which a launch made for a
    # run binds, is not there.
    missing = tmp_path / "inputs"
    monkeypatch.setattr(planning, "INPUT_FOLDER", missing)
    monkeypatch.setattr(running, "INPUT_FOLDER", missing)
    workspace = _workspace(config, "run-first")
    for_run = _run_plan(config, workspace)

    _answers(run_in_workspace(config, workspace, "echo ran; id -u"), workspace)
    wait_for(lambda: bool(launcher.ready(for_run, config)), BOUND_S, "a launch made for the run")
    for made in launcher.ready(for_run, config):  # each one's shell waits for the call
        assert made.forked is not None and not has_exited(made.forked.pidfd)
    result = run_in_workspace(config, workspace, "cat; id -u", stdin=b"ran\n")

    assert taken[-1].plan == for_run
    _answers(result, workspace)


def test_a_launch_whose_waiting_shell_died_is_not_taken(
    config: SandboxConfig, taken: list[Launch]
) -> None:
    workspace = _workspace(config, "run-shell-killed")
    for_run = _run_plan(config, workspace)
    _answers(run_in_workspace(config, workspace, "echo ran; id -u"), workspace)
    wait_for(
        lambda: len(launcher.ready(for_run, config)) == EACH_RUN,
        BOUND_S,
        "the launches made for the run",
    )
    # Each shell waiting for the run's next call dies; its init lives on, holding the socket.
    killed: set[int] = set()
    for made in launcher.ready(for_run, config):
        assert made.forked is not None
        os.kill(made.forked.pid, signal.SIGKILL)
        assert has_exited(made.forked.pidfd, BOUND_S), "the killed shell is gone"
        assert made.proc.poll() is None
        killed.add(made.forked.pid)

    handed: list[int] = []

    def note_the_shell() -> None:  # the call's launch is closed once it is over
        forked = taken[-1].forked
        handed.extend([] if forked is None else [forked.pid])

    result = run_in_workspace(config, workspace, "echo ran; id -u", before_start=note_the_shell)

    _answers(result, workspace)
    assert len(handed) == 1 and handed[0] not in killed


def test_a_launch_dead_at_the_hand_over_leaves_the_call_to_a_fresh_one(
    config: SandboxConfig, taken: list[Launch]
) -> None:
    workspace = _workspace(config, "run-dead-launch")
    for _ in range(2):  # the second call may take a launch made for the run
        _answers(run_in_workspace(config, workspace, "echo ran; id -u"), workspace)

    def kill_the_taken_launch() -> None:
        # Everything of the launch the call took dies after it was taken, before the call's
        # line goes: its socket's other end is closed.
        dead = taken[-1]
        pidfds = [os.pidfd_open(pid) for pid in dead.group.members()]
        assert pidfds, "the launch taken waits in its group"
        dead.group.kill(time.monotonic() + BOUND_S)
        for pidfd in pidfds:  # readable once the process exited and let go of its files
            assert has_exited(pidfd, BOUND_S), "a process of the killed launch is gone"
            os.close(pidfd)
        dead.proc.wait(BOUND_S)

    result = run_in_workspace(
        config, workspace, "echo ran; id -u", before_start=kill_the_taken_launch
    )

    _answers(result, workspace)
    assert taken[-1].proc.returncode is not None
