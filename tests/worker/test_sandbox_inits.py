"""A namespace's inits tell a command's end alike. The spawner's init and a bash init fork the
command's process before the call comes (the spawner's, where the init is the sandbox user
already, starts the call's shell then too), and the worker answers as soon as the command ended
alone, the namespace ending after; a dash init (where the kernel does not tell a reaped
process's exit status) starts the command when the call comes and ends everything before the
answer."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.worker.conftest import namespaces_unavailable, one_uid
from worker.sandbox import SHELL, SandboxConfig, run_sandboxed
from worker.sandbox.cgroup_layout import detect_layout
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.layers import plan_for, signals_ignored_here
from worker.sandbox.plan import Plan
from worker.sandbox.result import SandboxResult
from worker.sandbox.start.ready_pool import launcher


@dataclass(frozen=True)
class Init:
    """How a namespace's init is made, and the configuration its calls run under."""

    kind: str
    config: SandboxConfig
    where: Path


def _as_made_without(spawner: bool, bash: bool) -> Callable[[SandboxConfig, int], Plan]:
    """``plan_for`` as on a machine without the spawner (a worker that is not root), and
    without bash or a kernel that tells a reaped process's exit status."""

    def plan(config: SandboxConfig, euid: int) -> Plan:
        made = plan_for(config, euid)
        shell = (shutil.which("bash") or SHELL) if not bash else SHELL
        return dataclasses.replace(made, spawned=made.spawned and not spawner, init_shell=shell)

    return plan


@pytest.fixture(params=["spawner, shell ahead", "spawner", "bash", "dash"])
def init(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, sandbox_dir: Path
) -> Iterator[Init]:
    """Each way this machine can make a namespace's init: the spawner's, with the call's shell
    started ahead where the init is already the sandbox user; bash forking ahead; dash."""
    if os.geteuid() != 0 or not detect_layout("auto", "/sys/fs/cgroup").hierarchies:
        pytest.skip("an init runs in the namespace where a root worker makes control groups")
    if reason := namespaces_unavailable():
        pytest.skip(f"this machine gives no PID/network namespaces: {reason}")
    kind: str = request.param
    ahead = kind == "spawner, shell ahead"
    config = SandboxConfig(
        one_uid(isolation="namespaces"),
        workspace_root=str(sandbox_dir) if ahead else None,
    )
    plan = plan_for(config, 0).for_folder(str(sandbox_dir))
    if not plan.spawned:
        pytest.skip("no kernel that tells a reaped process's exit status through a pidfd")
    if kind == "bash" and not shutil.which("bash"):
        pytest.skip("no bash")
    if kind == "bash" and signals_ignored_here():
        pytest.skip("this process ignores SIGINT or SIGQUIT, which a bash init cannot give back")
    planner: Callable[[SandboxConfig, int], Plan] = plan_for
    if kind in ("bash", "dash"):
        planner = _as_made_without(True, kind == "dash")
        monkeypatch.setattr("worker.sandbox.command.plan_for", planner)
    made = planner(config, 0).for_folder(str(sandbox_dir))
    assert (made.shell_ahead is not None, made.forks_ahead) == (ahead, kind != "dash")
    launcher.release()
    yield Init(kind, config, sandbox_dir)
    launcher.release()


def run(command: str, init: Init, env: dict[str, str] | None = None) -> SandboxResult:
    return run_sandboxed(
        command,
        cwd=init.where,
        home=init.where,
        env=env or {},
        timeout_ms=10_000,
        config=init.config,
    )


def test_exit_statuses_are_exact(init: Init) -> None:
    killed = run("kill -9 $$", init)
    exited_high = run("exit 137", init)
    exited = run("echo out; echo err >&2; exit 3", init)

    assert killed.exit_code == 137
    # Told by the worker alone: nothing of the init's own reaches the command's output.
    assert killed.stderr.startswith("[the command was killed by SIGKILL")
    assert (exited_high.exit_code, exited_high.stderr) == (137, "")
    assert (exited.exit_code, exited.stdout, exited.stderr) == (3, "out\n", "err\n")


def test_a_command_starts_with_signals_empty_input_and_the_callers_variables(init: Init) -> None:
    probe = (
        "grep SigIgn /proc/self/status; cat; "
        "if [ -e /proc/self/fd/3 ]; then echo fd3-open; else echo fd3-closed; fi; "
        # dash passes on no variable whose name is not a shell name: its own environment has it.
        'echo "$FOO_BAR|$(tr "\\0" "\\n" </proc/$$/environ | grep ^weird-name=)|$$"'
    )

    result = run(probe, init, env={"FOO_BAR": "a 'b'", "weird-name": "c"})

    assert (result.exit_code, result.stderr) == (0, "")
    ignored, *rest = result.stdout.splitlines()
    assert not int(ignored.removeprefix("SigIgn:\t"), 16) & (
        1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)
    )
    # No input (cat ends at once), nothing of the init's socket, both variables, the first
    # process the init started.
    assert rest == ["fd3-closed", "a 'b'|weird-name=c|2"]


@pytest.fixture
def ignoring_interrupts() -> Iterator[None]:
    """This process ignores SIGINT and SIGQUIT, as a worker started in a script's background
    does; the plans made meanwhile are forgotten after."""
    before = {number: signal.getsignal(number) for number in (signal.SIGINT, signal.SIGQUIT)}
    for number in before:
        signal.signal(number, signal.SIG_IGN)
    plan_for.cache_clear()
    yield
    for number, handler in before.items():
        signal.signal(number, handler)
    plan_for.cache_clear()


@pytest.mark.usefixtures("ignoring_interrupts")
def test_a_worker_that_ignores_interrupts_gives_its_commands_them_back(init: Init) -> None:
    not_root = plan_for(init.config, 1000)

    result = run("grep SigIgn /proc/self/status", init)

    assert (result.exit_code, result.stderr) == (0, "")
    ignored = int(result.stdout.removeprefix("SigIgn:\t"), 16)
    assert not ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1))
    # A worker that is not root would have had a bash init: it has the dash one, whose command
    # gets the signals back from ``env``.
    assert (not_root.init_shell, not_root.restores_signals) == (SHELL, True)


def test_orphans_that_end_during_a_call_are_reaped(init: Init) -> None:
    if init.kind == "dash":
        pytest.skip("a dash init leaves every child unreaped until the worker read the command's")
    # Each ``true`` is orphaned at once: it ends as a child of the namespace's init. The command
    # waits (up to 5 s) for the init to have no child but the command's shell: a loaded machine
    # may not have run a ``true`` yet when there is no zombie.
    orphans = "i=0; while [ $i -lt 40 ]; do (/bin/true &); i=$((i+1)); done"
    adopted = """$(grep -l '^PPid:.1$' /proc/[0-9]*/status 2>/dev/null | grep -vc "^/proc/$$/")"""
    zombies = "$(grep -l '^State:.Z' /proc/[0-9]*/status 2>/dev/null | wc -l)"
    wait = f'n=0; while [ "{adopted}" -gt 0 ] && [ $n -lt 50 ]; do sleep 0.1; n=$((n+1)); done'

    result = run(f"{orphans}; {wait}; echo {zombies}", init)

    assert (result.exit_code, result.stdout) == (0, "0\n")
    assert result.usage.pids_peak is not None and result.usage.pids_peak < 40


def test_what_a_command_leaves_running_is_killed_and_counted(init: Init) -> None:
    result = run("sleep 300 & sleep 301 & echo started", init)

    assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
    assert result.usage.killed_processes == 2
    assert result.duration_ms < 5_000


def test_all_a_command_wrote_is_read_with_its_exact_size(init: Init) -> None:
    result = run("yes | head -c 200000; printf tail >&2", init)

    assert result.stdout_truncated
    assert result.stdout.endswith("of 200,000 bytes]")
    assert result.stderr == "tail"


def test_a_calls_group_is_removed_after_the_answer(init: Init) -> None:
    result = run("grep -m1 pids /proc/self/cgroup", init)

    group = Path(result.stdout.strip().split(":", 2)[2]).name
    folder = next(
        h.parent / group
        for h in detect_layout("auto", "/sys/fs/cgroup").hierarchies
        if "pids" in h.jobs
    )
    # Named after this process's worker id, whose lock proves it alive from any PID namespace.
    worker = HostRegistry(init.config.host_state).worker_id(init.config.fleet())
    assert folder.name.startswith(f"{worker}-"), folder
    wait_for(lambda: not folder.exists(), 10, "the call's group to be removed")
