"""What a sandboxed command cannot do: hurt or spy on the worker, exhaust the machine, go online."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import REPO, wait_for
from tests.worker.conftest import (
    NOBODY,
    config_for,
    namespaces_unavailable,
    one_uid,
    orphaned_sleep,
    sleeps,
)
from worker import sandbox
from worker.contract.sandbox_settings import SandboxSettings
from worker.sandbox import (
    SandboxConfig,
    SandboxError,
    SandboxResult,
    describe_isolation,
    run_sandboxed,
)
from worker.sandbox import layers as sandbox_layers

#: The fork bomb's process limit: a quarter of the default.
BOMB_PROCESSES = SandboxSettings.model_fields["max_processes"].default // 4

as_root = pytest.mark.skipif(
    os.geteuid() != 0, reason="commands run as another user, under rlimits, only for a root worker"
)


@pytest.fixture
def namespaced() -> None:
    if reason := namespaces_unavailable():
        pytest.skip(f"this machine gives no PID/network namespaces: {reason}")


def run(
    command: str, sandbox_dir: Path, config: SandboxConfig, timeout_ms: int = 5_000
) -> SandboxResult:
    return run_sandboxed(
        command, cwd=sandbox_dir, home=sandbox_dir, env={}, timeout_ms=timeout_ms, config=config
    )


def zombies_of(uid: int) -> list[int]:
    found = []
    for pid in _pids():
        try:
            owner = os.stat(f"/proc/{pid}").st_uid
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if owner == uid and state == "Z":
            found.append(pid)
    return found


def _pids() -> list[int]:
    return [int(entry) for entry in os.listdir("/proc") if entry.isdigit()]


def _cmdline(pid: int) -> list[bytes]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return []


@as_root
def test_describe_isolation_names_the_layers_of_each_setting(mode: str) -> None:
    layers = describe_isolation(config_for(mode, cgroup="off"))

    assert layers[:5] == [
        "process-group",
        "clean-environment",
        "user:nobody",
        "no-new-privileges",
        "rlimits",
    ]
    # Without a PID namespace, still an IPC namespace of the call's own; with no control group
    # the rlimits bound each process's memory alone, and the answer says so.
    expected = ["pid-namespace", "network-namespace"] if mode == "namespaces" else []
    expected += ["ipc-namespace", "session-keyring", "memory-per-process-only"]
    assert layers[5:] == expected


@as_root
def test_runs_as_the_unprivileged_user_without_extra_groups(mode: str, sandbox_dir: Path) -> None:
    result = run("id -u; id -G", sandbox_dir, config_for(mode))

    assert result.stdout == f"{NOBODY.pw_uid}\n{NOBODY.pw_gid}\n"


@as_root
def test_cannot_signal_or_trace_the_worker(mode: str, sandbox_dir: Path) -> None:
    if shutil.which("python3", path=sandbox.SAFE_PATH) is None:
        pytest.skip("no python3 on the sandbox's PATH to call ptrace with")
    worker = os.getpid()
    attach = f"import ctypes; print(ctypes.CDLL(None).ptrace(16, {worker}, 0, 0))"

    signal_result = run(f"kill -0 {worker}", sandbox_dir, config_for(mode))
    trace_result = run(f"python3 -c '{attach}'", sandbox_dir, config_for(mode))

    assert signal_result.exit_code != 0
    assert trace_result.stdout == "-1\n"


def wait_until_reaped() -> None:
    """Killed orphans stay zombies until init reaps them, and count against the sandbox user's
    process limit: until then, new commands may fail to fork. (The launches kept ready hold
    live processes of that user too, a few per configuration: those stay.)"""
    wait_for(lambda: len(zombies_of(NOBODY.pw_uid)) < 16, 30, "init to reap zombies")


@pytest.fixture
def reaped() -> Iterator[None]:
    yield
    wait_until_reaped()  # also when the test failed: the next tests need a free process table


@as_root
@pytest.mark.usefixtures("reaped")
def test_a_fork_bomb_is_stopped_and_the_worker_goes_on(mode: str, sandbox_dir: Path) -> None:
    token = f"bomb-{secrets.token_hex(8)}"  # every copy of the bomb carries it in its argv
    # The shells on top only exec: once the bomb fills the process limit, nothing can fork.
    bomb = f"exec bash -c ':(){{ :|:& }};: {token}; exec sleep 10'"

    # The limit is per user, and the tests beside this one run as the same user: the bomb gets
    # a quarter of the default, so that their commands can still fork while it lives.
    limited = config_for(mode, max_processes=BOMB_PROCESSES)
    result = run(bomb, sandbox_dir, limited, timeout_ms=1_000)

    assert result.timed_out is True
    assert "fork: retry: Resource temporarily unavailable" in result.stderr
    assert not [pid for pid in _pids() if any(token.encode() in a for a in _cmdline(pid))]
    wait_until_reaped()
    assert run("echo alive", sandbox_dir, config_for(mode)).stdout == "alive\n"


@as_root
def test_without_a_control_group_a_memory_hog_meets_the_address_space_limit(
    mode: str, sandbox_dir: Path
) -> None:
    if shutil.which("python3", path=sandbox.SAFE_PATH) is None:
        pytest.skip("no python3 on the sandbox's PATH")
    hog = "python3 -c 'block = bytearray(2 * 1024**3); print(len(block))'"

    result = run(hog, sandbox_dir, config_for(mode, memory_mb=512, cgroup="off"))

    assert result.exit_code == 1
    assert result.stdout == ""
    assert result.stderr.rstrip().endswith("MemoryError")


@as_root
def test_a_file_cannot_grow_past_the_limit(mode: str, sandbox_dir: Path) -> None:
    result = run(
        "dd if=/dev/zero of=big bs=1M count=3", sandbox_dir, config_for(mode, file_size_mb=1)
    )

    assert result.exit_code != 0
    assert (sandbox_dir / "big").stat().st_size <= 1024 * 1024


def test_the_network_is_out_of_reach_only_in_a_namespace(mode: str, sandbox_dir: Path) -> None:
    if shutil.which("bash", path=sandbox.SAFE_PATH) is None:
        pytest.skip("no bash to open a TCP connection with")
    with socket.create_server(("127.0.0.1", 0)) as server:
        port = server.getsockname()[1]
        result = run(f"bash -c 'exec 3<>/dev/tcp/127.0.0.1/{port}'", sandbox_dir, config_for(mode))

    if mode == "namespaces":
        assert result.exit_code != 0
        assert "Network is unreachable" in result.stderr
    else:
        assert result.exit_code == 0, result.stderr


@pytest.mark.netns
@pytest.mark.usefixtures("namespaced")
def test_a_pid_namespace_kills_leftovers_that_hide_from_the_sweep(sandbox_dir: Path) -> None:
    token = f"0.{secrets.randbelow(10**9):09d}1"
    hidden = (
        f"env -i setsid sh -c 'touch ready; exec sleep 300 {token}' & "
        "for i in $(seq 500); do [ -e ready ] && break; sleep 0.01; done"
    )

    run(hidden, sandbox_dir, config_for("namespaces"))

    assert not [pid for pid in _pids() if token.encode() in _cmdline(pid)]


def test_auto_falls_back_to_process_isolation_without_namespaces(
    sandbox_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reason = "unshare: unshare failed: Operation not permitted"
    monkeypatch.setattr(sandbox_layers, "probe_failure", lambda argv: reason)
    sandbox_layers.plan_for.cache_clear()
    try:
        layers = describe_isolation(SandboxConfig(one_uid(isolation="auto")))
        result = run(
            "echo still works",
            sandbox_dir,
            SandboxConfig(one_uid(isolation="auto")),
        )
        with pytest.raises(SandboxError, match="Operation not permitted"):
            describe_isolation(SandboxConfig(one_uid(isolation="namespaces")))
    finally:
        sandbox_layers.plan_for.cache_clear()

    assert "pid-namespace" not in layers
    assert "network-namespace" not in layers
    assert result.stdout == "still works\n"
    assert result.isolation == tuple(layers)


@as_root
def test_a_missing_sandbox_user_is_a_clear_error() -> None:
    with pytest.raises(SandboxError, match="'toolq-no-such-user' does not exist"):
        describe_isolation(SandboxConfig(one_uid(user="toolq-no-such-user")))


@as_root
def test_a_worker_that_is_not_root_isolates_what_it_can(sandbox_dir: Path) -> None:
    script = (
        "import json, pathlib\n"
        "from worker.sandbox import SandboxConfig, SandboxSettings, describe_isolation\n"
        "from worker.sandbox import run_sandboxed\n"
        "here = pathlib.Path.cwd()\n"
        "for mode in ('auto', 'process'):\n"
        "    config = SandboxConfig(SandboxSettings(uid_range='', isolation=mode))\n"
        "    result = run_sandboxed('id -u; echo $HOME', cwd=here, home=here, env={},\n"
        "                           timeout_ms=5000, config=config)\n"
        "    print(json.dumps([mode, describe_isolation(config), result.stdout]))\n"
    )

    done = _run_as_nobody(script, sandbox_dir)

    answers = {mode: (layers, out) for mode, layers, out in map(json.loads, done.splitlines())}
    # No IPC namespace without root's privilege, but a session keyring of the call's own.
    process_layers = ["process-group", "clean-environment", "rlimits", "session-keyring"]
    process_layers.append("memory-per-process-only")  # nobody makes no control group
    assert answers["process"] == (process_layers, f"{NOBODY.pw_uid}\n{sandbox_dir}\n")
    auto_layers, auto_out = answers["auto"]
    if "user-namespace" in auto_layers:  # unprivileged user namespaces work here
        assert auto_layers[3:6] == ["pid-namespace", "network-namespace", "ipc-namespace"]
        assert "user-namespace" in auto_layers
        assert auto_out == f"0\n{sandbox_dir}\n"  # root inside, the worker's user outside
    else:
        assert auto_layers == process_layers


def _run_as_nobody(script: str, sandbox_dir: Path) -> str:
    """Run ``script`` with this interpreter as nobody; skip when nobody cannot run it."""
    drop = ["setpriv", f"--reuid={NOBODY.pw_uid}", f"--regid={NOBODY.pw_gid}", "--clear-groups"]
    env = {"PATH": sandbox.SAFE_PATH, "PYTHONPATH": str(REPO)}
    probe = subprocess.run(
        [*drop, sys.executable, "-c", "import worker.sandbox"],
        cwd=sandbox_dir, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if probe.returncode != 0:
        pytest.skip(f"nobody cannot run this interpreter: {probe.stderr.strip()[-200:]}")
    done = subprocess.run(
        [*drop, sys.executable, "-c", script],
        cwd=sandbox_dir, env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


@as_root
def test_an_unprivileged_worker_still_limits_its_commands(sandbox_dir: Path) -> None:
    """Lowering one's own rlimits needs no privilege: a worker that is not root applies them."""
    script = (
        "import pathlib\n"
        "from worker.sandbox import SandboxConfig, SandboxSettings, run_sandboxed\n"
        "here = pathlib.Path.cwd()\n"
        "settings = SandboxSettings(uid_range='', isolation='process', file_size_mb=1)\n"
        "config = SandboxConfig(settings)\n"
        "result = run_sandboxed('head -c 3000000 /dev/zero > big; echo $?', cwd=here, home=here,\n"
        "                       env={}, timeout_ms=5000, config=config)\n"
        "print('rlimits' in result.isolation, result.stdout.strip())\n"
    )

    applied, code = _run_as_nobody(script, sandbox_dir).split()[:2]

    assert applied == "True"
    assert code != "0"
    assert (sandbox_dir / "big").stat().st_size <= 1024 * 1024


def test_a_worker_killed_mid_call_leaves_no_command_running(mode: str, sandbox_dir: Path) -> None:
    """With namespaces the command dies with its worker; without, the next worker sweeps it."""
    tag = orphaned_sleep(
        sandbox_dir, f"SandboxConfig(SandboxSettings(uid_range='', isolation={mode!r}))"
    )
    if mode == "process":
        wait_for(
            lambda: sandbox.sweep_orphans(config_for(mode)) == 0 and not sleeps(tag),
            10,
            "the sweep to end the orphaned command",
        )
    else:
        wait_for(lambda: not sleeps(tag), 10, "the namespace to die with its worker")
