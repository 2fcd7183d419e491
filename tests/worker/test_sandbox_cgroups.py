"""Control groups for run_bash on this machine: a group per command that limits, counts and
kills it, a fallback where none can be made, and nothing left behind, not even by a worker killed
as it starts a command. (Which hierarchy does which job: test_cgroup_layouts.py.)"""

from __future__ import annotations

import os
import secrets
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import replace
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for
from tests.worker.conftest import config_for, one_uid, sleeps
from worker import sandbox
from worker.contract.sandbox_settings import SandboxSettings
from worker.plumbing.proc_stat import process_alive
from worker.sandbox import SandboxConfig, SandboxError, describe_isolation, run_sandboxed
from worker.sandbox.cgroup_layout import CgroupLayout, detect_layout
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.layers import plan_for
from worker.sandbox.result import SandboxResult
from worker.sandbox.start.ready_pool import READY, launcher

ROOT = "/sys/fs/cgroup"


as_root = pytest.mark.skipif(os.geteuid() != 0, reason="the tests make groups as root")


def _machine_layout() -> CgroupLayout:
    return detect_layout("auto", ROOT)


@pytest.fixture
def grouped() -> CgroupLayout:
    """Skips unless this machine gives a group per command that kills, limits and counts."""
    if os.geteuid() != 0:
        pytest.skip("control groups are made by a root worker here")
    layout = _machine_layout()
    missing = [f"{job}: {why}" for job, why in layout.missing]
    if missing:
        pytest.skip(f"this machine gives no group for every job: {'; '.join(missing)}")
    return layout


def run(
    command: str, where: Path, config: SandboxConfig, timeout_ms: int = 10_000
) -> SandboxResult:
    return run_sandboxed(
        command, cwd=where, home=where, env={}, timeout_ms=timeout_ms, config=config
    )


def _limits(where: Path, config: SandboxConfig) -> dict[str, str]:
    """The rlimits a command gets, from /proc/self/limits."""
    text = run("cat /proc/self/limits", where, config).stdout
    return {line[:26].strip(): line[26:47].strip() for line in text.splitlines()[1:]}


@as_root
def test_a_machine_without_groups_falls_back_to_rlimits(sandbox_dir: Path, tmp_path: Path) -> None:
    config = SandboxConfig(one_uid(isolation="process", cgroup_root=str(tmp_path), memory_mb=300))

    layers = describe_isolation(config)
    limits = _limits(sandbox_dir, config)
    result = run(
        "i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done; sleep 30 &", sandbox_dir, config
    )

    assert not [layer for layer in layers if layer.startswith("cgroup")]
    assert limits["Max address space"] == str(300 * 2**20)
    assert limits["Max processes"] == "256"
    assert result.usage.cpu_ms is not None and result.usage.cpu_ms > 0
    assert (result.usage.pids_peak, result.usage.max_rss_kb, result.usage.killed_processes) == (
        None,
        None,
        None,
    )


@as_root
def test_asking_for_a_version_the_machine_lacks_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match=r"cgroup v2 was requested .* no cgroup v2 hierarchy"):
        describe_isolation(SandboxConfig(one_uid(cgroup="v2", cgroup_root=str(tmp_path))))


def test_with_groups_the_rlimits_leave_memory_and_processes_to_them(
    grouped: CgroupLayout, sandbox_dir: Path
) -> None:
    limits = _limits(sandbox_dir, SandboxConfig(one_uid(isolation="process")))

    assert limits["Max address space"] == "unlimited"
    assert limits["Max processes"] != "256"
    assert limits["Max file size"] == str(256 * 2**20)


def _own_worker() -> str:
    """This process's worker id, which names the call groups it makes."""
    config = SandboxConfig(one_uid())
    return HostRegistry(config.host_state).worker_id(config.fleet())


def _processes_in_own_groups(layout: CgroupLayout) -> int:
    """Processes now in the call groups this test process made."""
    pids = layout.doing("pids")
    assert pids is not None
    mine = [d for d in pids.parent.iterdir() if d.name.startswith(_own_worker() + "-")]
    return sum(int((d / "pids.current").read_text()) for d in mine if (d / "pids.current").exists())


def test_each_command_has_a_process_limit_of_its_own(
    grouped: CgroupLayout, mode: str, sandbox_dir: Path
) -> None:
    limit = 48
    config = config_for(mode, max_processes=limit)
    bomb: list[SandboxResult] = []
    thread = threading.Thread(
        target=lambda: bomb.append(
            run("exec bash -c ':(){ :|:& };:; sleep 60'", sandbox_dir, config, timeout_ms=4_000)
        )
    )
    thread.start()
    try:
        wait_for(lambda: _processes_in_own_groups(grouped) >= limit * 0.8, 10, "the bomb to fill")
        neighbour = run(
            "i=0; while [ $i -lt 20 ]; do /bin/true || exit 9; i=$((i+1)); done; echo fine",
            sandbox_dir,
            config,
        )
    finally:
        thread.join(30)

    assert neighbour.stdout == "fine\n", neighbour.stderr
    assert bomb[0].timed_out
    assert limit * 0.8 <= (bomb[0].usage.pids_peak or 0) <= limit
    assert (bomb[0].usage.killed_processes or 0) >= limit * 0.5


def test_memory_is_limited_by_what_a_command_holds_not_what_it_reserves(
    grouped: CgroupLayout, mode: str, sandbox_dir: Path
) -> None:
    if shutil.which("python3", path=sandbox.SAFE_PATH) is None:
        pytest.skip("no python3 on the sandbox's PATH")
    config = config_for(mode, memory_mb=256)
    reserve = "python3 -c 'import mmap; m = mmap.mmap(-1, 8 << 30); print(len(m) >> 30)'"
    touch = "python3 -c 'block = bytearray(512 << 20); print(len(block))'"

    reserved = run(reserve, sandbox_dir, config)
    touched = run(touch, sandbox_dir, config)

    assert (reserved.exit_code, reserved.stdout) == (0, "8\n"), reserved.stderr
    assert not reserved.usage.oom_killed
    assert touched.exit_code == 128 + signal.SIGKILL
    assert touched.usage.oom_killed
    assert "memory limit" in touched.stderr
    assert (touched.usage.max_rss_kb or 0) <= 256 * 1024


@pytest.mark.parametrize("version", ["auto", "v1", "v2"])
def test_leftovers_are_counted_killed_and_gone(
    grouped: CgroupLayout, mode: str, version: str, sandbox_dir: Path
) -> None:
    tag = f"{secrets.randbelow(10**6)}31"
    config = config_for(mode, cgroup=version)

    result = run(f"setsid sleep 300.{tag} & (sleep 301.{tag} &); echo started", sandbox_dir, config)

    assert result.stdout == "started\n"
    assert result.usage.killed_processes == 2
    assert not sleeps(tag)
    launcher.release()  # the group made ready for the next call
    assert not _own_groups(grouped)


def test_cpu_time_counts_every_process_of_the_command(
    grouped: CgroupLayout, mode: str, sandbox_dir: Path
) -> None:
    spin = "i=0; while [ $i -lt 150000 ]; do i=$((i+1)); done"
    # ``times`` prints the shell's own CPU time, then its waited-for children's.
    result = run(f"({spin}) & ({spin}) & wait; times", sandbox_dir, config_for(mode))

    children = result.stdout.splitlines()[1].split()
    told_ms = sum(_seconds(text) for text in children) * 1000
    assert result.usage.cpu_ms is not None
    assert told_ms > 100
    assert told_ms * 0.9 <= result.usage.cpu_ms <= told_ms * 1.2 + 30


def _seconds(text: str) -> float:
    minutes, _, seconds = text.rstrip("s").partition("m")
    return int(minutes) * 60 + float(seconds)


def test_v2_limits_processes_and_memory_where_it_has_the_controllers(
    sandbox_dir: Path,
) -> None:
    if os.geteuid() != 0:
        pytest.skip("control groups are made by a root worker here")
    layout = detect_layout("v2", ROOT)
    if not layout.hierarchies:
        pytest.skip(f"no usable cgroup v2 hierarchy: {dict(layout.missing)}")
    reasons = dict(layout.missing)
    if "pids" in reasons or "memory" in reasons:
        pytest.skip(
            f"cgroup v2 here cannot limit processes and memory: {reasons.get('pids')}; "
            f"{reasons.get('memory')}"
        )
    config = SandboxConfig(
        SandboxSettings(
            uid_range="", isolation="process", cgroup="v2", memory_mb=128, max_processes=8
        )
    )

    result = run("for i in $(seq 20); do sleep 5 & done; wait", sandbox_dir, config)
    hog = run("head -c 300M /dev/zero | tail -c 1", sandbox_dir, config)

    assert "fork" in result.stderr.lower() or result.exit_code != 0
    assert hog.usage.oom_killed


def _own_groups(layout: CgroupLayout) -> list[Path]:
    return [
        d
        for hierarchy in layout.hierarchies
        for d in hierarchy.parent.iterdir()
        if d.name.startswith(_own_worker() + "-")
    ]


_DIES_AS_IT_SPAWNS = """
import os, signal, sys
from pathlib import Path
from worker.sandbox import SandboxConfig, SandboxSettings, describe_isolation, run_sandboxed
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.start.launch import Launch
settings = SandboxSettings(uid_range="", isolation=sys.argv[1])
config = SandboxConfig(settings, workspace_root=sys.argv[4])
describe_isolation(config)  # the plan's own probes run before the worker is made to die
print(HostRegistry(config.host_state).worker_id(config.fleet()), flush=True)
send = Launch.start

def start_and_die(self, *args, **kwargs):
    send(self, *args, **kwargs)
    print(getattr(self.proc, "pid", ""), flush=True)  # the launch's first process
    os.kill(os.getpid(), signal.SIGKILL)  # before the command's parent-death signal is set

Launch.start = start_and_die
where = Path(sys.argv[2])
run_sandboxed(f"sleep 300.{sys.argv[3]}; echo", cwd=where, home=where, env={}, timeout_ms=60000,
              config=config)
"""


def test_a_worker_killed_as_it_spawns_leaves_nothing_after_the_sweep(
    grouped: CgroupLayout, mode: str, sandbox_dir: Path, tmp_path: Path
) -> None:
    """The spawn race: killed between starting the command and its parent-death signal, the
    worker leaves a command running in a group named after it, which the next sweep ends. An
    init that forked ahead was ready, its parent-death signal set, before the line went: the
    command dies with the worker, and only the group is left for the sweep."""
    tag = f"{secrets.randbelow(10**6)}41"
    # A fleet of its own (a workspace root the sandbox user cannot enter, so the plan is the
    # mode's own): any sandbox call of the default fleet beside it sweeps that fleet's dead
    # workers' groups, and could end this orphan before the test sees it.
    tmp_path.chmod(0o700)
    config = replace(config_for(mode), workspace_root=str(tmp_path))
    worker = subprocess.run(
        [sys.executable, "-c", _DIES_AS_IT_SPAWNS, mode, str(sandbox_dir), tag, str(tmp_path)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert worker.returncode == -signal.SIGKILL, worker.stderr
    worker_id, first = worker.stdout.split()
    orphans = [
        d
        for h in grouped.hierarchies
        for d in h.parent.iterdir()
        if d.name.startswith(f"{worker_id}-")
    ]
    if plan_for(config, os.geteuid()).forks_ahead:
        wait_for(lambda: not sleeps(tag), 10, "the command to die with its worker")
    else:
        # The command runs on without its worker: nothing but its group can find it now. On a
        # busy machine the shell may read the line and set the parent-death signal before the
        # worker is gone (the guard wins the race): then the command dies with the worker, and
        # only the empty group is left for the sweep.
        wait_for(
            lambda: bool(sleeps(tag)) or not process_alive(int(first)),
            10,
            "the orphaned command to start, or its shell to die with the worker",
        )

    swept = sandbox.sweep_orphans(config)

    assert orphans
    assert swept >= 1
    wait_for(lambda: not sleeps(tag), 10, "the orphaned command to end")
    assert not [d for d in orphans if d.exists()]


def test_a_launch_is_ready_with_its_namespaces_before_the_call_comes(
    grouped: CgroupLayout, sandbox_dir: Path
) -> None:
    config = config_for("namespaces")
    plan = plan_for(config, os.geteuid())
    launcher.release()
    launcher.prepare(plan, config)
    try:
        wait_for(lambda: len(launcher.ready(plan, config)) == READY, 10, "the launches made ready")
        own_namespace = os.readlink("/proc/self/ns/pid")
        for made in launcher.ready(plan, config):
            # The process started becomes unshare; its one child is the namespace's init,
            # waiting in a PID namespace of its own for the call's command line.
            started = made.proc.pid
            wait_for(lambda: bool(_children(started)), 10, "the init started")  # noqa: B023
            (init,) = _children(started)
            assert os.readlink(f"/proc/{init}/ns/pid") != own_namespace
            # Named in its command line (a shell's) or, made by the spawner, in its name.
            named = {
                (Path(f"/proc/{init}") / "comm").read_text().strip(),
                *(Path(f"/proc/{init}") / "cmdline").read_bytes().decode().split("\0"),
            }
            assert "toolq-init" in named
            assert made.proc.poll() is None, "a ready launch died with the thread that made it"
        result = run("echo $$", sandbox_dir, config)
        assert result.stdout == "2\n"  # the init is 1: the command is its first child
    finally:
        launcher.release()
    assert not _own_groups(grouped)


def _children(pid: int) -> list[int]:
    listing = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(child) for child in listing.split()]
