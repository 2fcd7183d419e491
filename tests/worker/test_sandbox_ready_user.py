"""A root worker's ready launches that are already the sandbox user: the call starts the shell
alone, and the command sees what it would see from a call that drops to the user itself."""

from __future__ import annotations

import os
import signal
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.worker.conftest import NOBODY, one_uid
from worker.sandbox import SandboxConfig, run_sandboxed
from worker.sandbox.cgroup_layout import detect_layout
from worker.sandbox.layers import plan_for
from worker.sandbox.result import SandboxResult
from worker.sandbox.start.ready_pool import READY, launcher


@pytest.fixture(autouse=True)
def _grouped_as_root() -> None:
    """Ready launches are the sandbox user's where a root worker makes control groups (asked
    when a test runs, not when tests are collected: finding the layout prepares groups)."""
    if os.geteuid() != 0 or not detect_layout("auto", "/sys/fs/cgroup").hierarchies:
        pytest.skip("ready launches are the sandbox user's where a root worker makes groups")


PROBE = (
    "pwd; id -u; echo $HOME $FOO; grep SigIgn /proc/self/status; "
    "ulimit -t; ulimit -H -t; ulimit -f; echo $$"
)


@pytest.fixture
def workspace_root() -> Iterator[Path]:
    """A root-owned folder of runs the sandbox user may pass through, above a closed one."""
    closed = Path(tempfile.mkdtemp(prefix="toolq-closed-"))  # 0700, root's
    root = closed / "workspaces"
    root.mkdir(mode=0o755)
    yield root
    launcher.release()
    for path in sorted(closed.rglob("*"), reverse=True):
        path.rmdir() if path.is_dir() and not path.is_symlink() else path.unlink()
    closed.rmdir()


def _run_folder(root: Path, name: str) -> Path:
    folder = root / name
    folder.mkdir()
    os.chown(folder, NOBODY.pw_uid, NOBODY.pw_gid)
    return folder


def _run(command: str, cwd: Path, config: SandboxConfig) -> SandboxResult:
    return run_sandboxed(
        command, cwd=cwd, home=cwd, env={"FOO": "bar"}, timeout_ms=5_000, config=config
    )


def test_the_command_sees_the_same_as_from_a_root_init(workspace_root: Path) -> None:
    run = _run_folder(workspace_root, "run-1")
    ready = SandboxConfig(one_uid(), workspace_root=str(workspace_root))
    assert plan_for(ready, 0).ready_in == str(workspace_root)

    fast = _run(PROBE, run, ready)
    dropping = _run(PROBE, run, SandboxConfig(one_uid()))

    assert (fast.exit_code, fast.stderr) == (0, "")
    assert fast.stdout == dropping.stdout
    lines = fast.stdout.splitlines()
    assert lines[:3] == [str(run), str(NOBODY.pw_uid), f"{run} bar"]
    ignored = int(lines[3].removeprefix("SigIgn:\t"), 16)
    assert not ignored & (1 << (signal.SIGINT - 1) | 1 << (signal.SIGQUIT - 1))
    assert lines[4:] == ["6", "7", str(256 * 1024 * 1024 // 512), "2"]


def test_the_init_is_the_sandbox_user_before_the_call_comes(workspace_root: Path) -> None:
    config = SandboxConfig(one_uid(), workspace_root=str(workspace_root))
    plan = plan_for(config, 0)
    launcher.release()
    launcher.prepare(plan, config)
    wait_for(lambda: len(launcher.ready(plan, config)) == READY, 10, "the launches made ready")
    for made in launcher.ready(plan, config):
        started = made.proc.pid
        wait_for(lambda: bool(_children(started)), 10, "the init started")  # noqa: B023
        (init,) = _children(started)
        wait_for(lambda: os.stat(f"/proc/{init}").st_uid == NOBODY.pw_uid, 10, "the drop")  # noqa: B023
        assert os.readlink(f"/proc/{init}/cwd") == str(workspace_root)


def test_statuses_and_leftovers_are_told_as_from_a_root_init(workspace_root: Path) -> None:
    run = _run_folder(workspace_root, "run-2")
    config = SandboxConfig(one_uid(), workspace_root=str(workspace_root))

    killed = _run("kill -9 $$", run, config)
    exited = _run("exit 137", run, config)
    left = _run("sleep 300 & setsid sleep 301 & echo started", run, config)

    assert killed.exit_code == 128 + signal.SIGKILL
    assert "killed by SIGKILL" in killed.stderr
    assert (exited.exit_code, exited.stderr) == (137, "")
    assert left.stdout == "started\n"
    assert left.usage.killed_processes == 2


def test_a_folder_outside_the_runs_is_entered_by_an_init_that_stays_root(
    workspace_root: Path,
) -> None:
    closed = workspace_root.parent
    elsewhere = closed / "elsewhere"
    elsewhere.mkdir()
    os.chown(elsewhere, NOBODY.pw_uid, NOBODY.pw_gid)
    config = SandboxConfig(one_uid(), workspace_root=str(workspace_root))

    result = _run("pwd; id -u", elsewhere, config)

    assert (result.stdout, result.exit_code) == (f"{elsewhere}\n{NOBODY.pw_uid}\n", 0)


def test_runs_the_sandbox_user_cannot_pass_through_keep_a_root_init(tmp_path: Path) -> None:
    closed = tmp_path / "closed"
    closed.mkdir(mode=0o700)
    assert plan_for(SandboxConfig(one_uid(), workspace_root=str(closed)), 0).ready_in is None


def _children(pid: int) -> list[int]:
    listing = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in listing.split()]


def test_the_callers_variables_reach_the_command_as_from_a_root_init(
    workspace_root: Path,
) -> None:
    run = _run_folder(workspace_root, "run-3")
    variables = {"A-B": "not a shell name", "ANSWER": 'it\'s "quoted"\nand two lines'}
    command = "env | grep -A1 -E '^(A-B|ANSWER)=' | sort"
    fast, dropping = (
        run_sandboxed(command, cwd=run, home=run, env=variables, timeout_ms=5_000, config=config)
        for config in (
            SandboxConfig(one_uid(), workspace_root=str(workspace_root)),
            SandboxConfig(one_uid()),
        )
    )
    assert (fast.stdout, fast.stderr, fast.exit_code) == (dropping.stdout, "", 0)
    assert 'ANSWER=it\'s "quoted"' in fast.stdout


@pytest.mark.parametrize("isolation", ["namespaces", "process"])
def test_every_plan_drops_to_the_sandbox_user(workspace_root: Path, isolation: str) -> None:
    run = _run_folder(workspace_root, f"run-{isolation}")
    for cgroup in ("auto", "off"):
        config = SandboxConfig(
            one_uid(cgroup=cgroup, isolation=isolation),
            workspace_root=str(workspace_root),
        )
        assert _run("id -u", run, config).stdout == f"{NOBODY.pw_uid}\n", config
