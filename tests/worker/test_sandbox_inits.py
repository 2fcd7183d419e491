"""The namespace's two inits tell a command's end alike. A bash init forks the command's process
before the call comes and the worker answers as soon as the command ended alone, the namespace
ending after; a dash init (where bash or the kernel's pidfd exit status is missing) starts the
command when the call comes and ends everything before the answer."""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.worker.conftest import namespaces_unavailable
from worker.sandbox import SandboxConfig, run_sandboxed
from worker.sandbox import plan as sandbox_plan
from worker.sandbox.cgroups import detect_layout
from worker.sandbox.launch import launcher
from worker.sandbox.plan import plan_for
from worker.sandbox.result import SandboxResult

CONFIG = SandboxConfig(isolation="namespaces")


@pytest.fixture(params=["bash", "dash"])
def init(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The init a namespace's calls get: bash forking ahead, or dash."""
    if os.geteuid() != 0 or not detect_layout("auto", "/sys/fs/cgroup").hierarchies:
        pytest.skip("an init runs in the namespace where a root worker makes control groups")
    if reason := namespaces_unavailable():
        pytest.skip(f"this machine gives no PID/network namespaces: {reason}")
    launcher.release()
    plan_for.cache_clear()
    if request.param == "dash":
        monkeypatch.setattr(sandbox_plan, "tells_exit_after_reaping", lambda: False)
    elif not plan_for(CONFIG, 0).forks_ahead:
        pytest.skip("no bash, or a kernel that does not tell a reaped process's exit status")
    assert plan_for(CONFIG, 0).forks_ahead == (request.param == "bash")
    yield request.param
    launcher.release()
    plan_for.cache_clear()


def run(
    command: str, where: Path, env: dict[str, str] | None = None, timeout_ms: int = 10_000
) -> SandboxResult:
    return run_sandboxed(
        command, cwd=where, home=where, env=env or {}, timeout_ms=timeout_ms, config=CONFIG
    )


def test_exit_statuses_are_exact(init: str, sandbox_dir: Path) -> None:
    killed = run("kill -9 $$", sandbox_dir)
    exited_high = run("exit 137", sandbox_dir)
    exited = run("echo out; echo err >&2; exit 3", sandbox_dir)

    assert killed.exit_code == 137
    # Told by the worker alone: nothing of the init's own reaches the command's output.
    assert killed.stderr.startswith("[the command was killed by SIGKILL")
    assert (exited_high.exit_code, exited_high.stderr) == (137, "")
    assert (exited.exit_code, exited.stdout, exited.stderr) == (3, "out\n", "err\n")


def test_a_command_starts_with_signals_empty_input_and_the_callers_variables(
    init: str, sandbox_dir: Path
) -> None:
    probe = (
        "grep SigIgn /proc/self/status; cat; "
        "if [ -e /proc/self/fd/3 ]; then echo fd3-open; else echo fd3-closed; fi; "
        # dash passes on no variable whose name is not a shell name: its own environment has it.
        'echo "$FOO_BAR|$(tr "\\0" "\\n" </proc/$$/environ | grep ^weird-name=)|$$"'
    )

    result = run(probe, sandbox_dir, env={"FOO_BAR": "a 'b'", "weird-name": "c"})

    assert (result.exit_code, result.stderr) == (0, "")
    ignored, *rest = result.stdout.splitlines()
    assert not int(ignored.removeprefix("SigIgn:\t"), 16) & (
        1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1)
    )
    # No input (cat ends at once), nothing of the init's socket, both variables, the first
    # process the init started.
    assert rest == ["fd3-closed", "a 'b'|weird-name=c|2"]


def test_what_a_command_leaves_running_is_killed_and_counted(init: str, sandbox_dir: Path) -> None:
    result = run("sleep 300 & sleep 301 & echo started", sandbox_dir)

    assert (result.exit_code, result.stdout, result.timed_out) == (0, "started\n", False)
    assert result.usage.killed_processes == 2
    assert result.duration_ms < 5_000


def test_all_a_command_wrote_is_read_with_its_exact_size(init: str, sandbox_dir: Path) -> None:
    result = run("yes | head -c 200000; printf tail >&2", sandbox_dir)

    assert result.stdout_truncated
    assert result.stdout.endswith("of 200,000 bytes]")
    assert result.stderr == "tail"


def test_a_calls_group_is_removed_after_the_answer(init: str, sandbox_dir: Path) -> None:
    result = run("grep -m1 pids /proc/self/cgroup", sandbox_dir)

    group = Path(result.stdout.strip().split(":", 2)[2]).name
    folder = next(
        h.parent / group
        for h in detect_layout("auto", "/sys/fs/cgroup").hierarchies
        if "pids" in h.jobs
    )
    assert folder.name.startswith(f"{os.getpid()}."), folder
    wait_for(lambda: not folder.exists(), 10, "the call's group to be removed")
