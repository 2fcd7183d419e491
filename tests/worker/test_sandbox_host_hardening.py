"""Process mode on a host: a worker whose runs share /tmp turns on the sysctls that keep them
apart there, or refuses to start in one line; and each command's /proc shows its own uid's
processes only, where the machine allows a mount namespace."""

from __future__ import annotations

import logging
import os
import subprocess
import threading
from pathlib import Path

import pytest

from api.local.stack import worker_argv, worker_environment
from tests.conftest import RedisServer, fleet_settings, wait_for
from tests.host_sysctls import host_is_hardened, host_sysctls_restored, read_host_sysctls
from tests.reliability.conftest import pids_with
from tests.worker.conftest import RUN_UIDS, one_uid, run_in_workspace
from worker.contract.sandbox_settings import SandboxSettings
from worker.sandbox import SandboxConfig
from worker.sandbox.hardening import hardening_refusal
from worker.sandbox.layers import LAYER_HIDDEN_PROCESSES
from worker.tasks import EXIT_CANNOT_ISOLATE
from worker.tools.factory import prepare_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need a root worker")

REGULAR = ("fs", "protected_regular")
SYMLINKS = ("fs", "protected_symlinks")


def _fake_sysctls(tmp_path: Path, regular: str, symlinks: str) -> Path:
    """A folder laid out as /proc/sys with the two sysctls at these values."""
    root = tmp_path / "sys"
    (root / "fs").mkdir(parents=True)
    (root.joinpath(*REGULAR)).write_text(f"{regular}\n")
    (root.joinpath(*SYMLINKS)).write_text(f"{symlinks}\n")
    return root


def _process_mode(tmp_path: Path, hardening: str) -> SandboxConfig:
    return SandboxConfig(
        SandboxSettings(isolation="process", uid_range=str(RUN_UIDS), host_hardening=hardening),
        workspace_root=str(tmp_path),
    )


def test_a_worker_told_only_to_check_refuses_a_host_with_the_sysctls_off(tmp_path: Path) -> None:
    sysctls = _fake_sysctls(tmp_path, "0", "0")

    refusal = hardening_refusal(_process_mode(tmp_path, "check"), sysctls)

    assert refusal is not None and "\n" not in refusal
    assert "fs.protected_regular=0, fs.protected_symlinks=0" in refusal
    assert "TOOLQ_SANDBOX_HOST_HARDENING=off" in refusal
    # Checked, not changed.
    assert sysctls.joinpath(*REGULAR).read_text() == "0\n"
    # One of them on: the other is named alone.
    sysctls.joinpath(*REGULAR).write_text("2\n")
    refusal = hardening_refusal(_process_mode(tmp_path, "check"), sysctls)
    assert refusal is not None
    assert "fs.protected_symlinks=0" in refusal and "protected_regular" not in refusal


def test_a_worker_that_cannot_set_the_sysctls_refuses_to_start(tmp_path: Path) -> None:
    sysctls = _fake_sysctls(tmp_path, "0", "0")
    # As on a kernel without it: neither read nor written.
    sysctls.joinpath(*REGULAR).unlink()
    sysctls.joinpath(*REGULAR).mkdir()

    refusal = hardening_refusal(_process_mode(tmp_path, "set"), sysctls)

    assert refusal is not None
    assert "fs.protected_regular=unknown" in refusal
    assert "cannot set them" in refusal
    assert "TOOLQ_SANDBOX_HOST_HARDENING=off" in refusal


def test_a_root_worker_sets_the_sysctls_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    sysctls = _fake_sysctls(tmp_path, "0", "1")

    with caplog.at_level(logging.WARNING, logger="worker.sandbox.hardening"):
        assert hardening_refusal(_process_mode(tmp_path, "set"), sysctls) is None

    assert sysctls.joinpath(*REGULAR).read_text() == "1\n"
    assert sysctls.joinpath(*SYMLINKS).read_text() == "1\n"
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "set fs.protected_regular=1" in lines[0]
    assert "protected_symlinks" not in lines[0]


def test_the_sysctls_are_left_alone_where_runs_do_not_share_tmp(tmp_path: Path) -> None:
    sysctls = _fake_sysctls(tmp_path, "0", "0")
    allowed = _process_mode(tmp_path, "off")
    namespaced = SandboxConfig(
        SandboxSettings(isolation="namespaces", uid_range=str(RUN_UIDS)),
        workspace_root=str(tmp_path),
    )
    one_uid = SandboxConfig(SandboxSettings(isolation="process", uid_range="", shared="allow"))

    for config in (allowed, namespaced, one_uid):
        assert hardening_refusal(config, sysctls) is None, config

    assert sysctls.joinpath(*REGULAR).read_text() == "0\n"


@pytest.mark.integration
def test_a_process_mode_worker_on_this_host_refuses_or_hardens_it(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    """The real /proc/sys: told only to check, the worker refuses and the host is unchanged;
    told to set them, it starts and they are on (then put back as they were)."""
    if host_is_hardened():
        pytest.skip("this host has fs.protected_regular and fs.protected_symlinks on already")
    settings = fleet_settings(
        own_redis.url,
        tmp_path,
        sandbox_isolation="process",
        sandbox_host_hardening="check",
    )
    env = {**os.environ, **worker_environment(settings)}
    argv = worker_argv("sandbox", node="hardening@%h", loglevel="WARNING")
    with host_sysctls_restored() as found:
        refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)

        assert refused.returncode == EXIT_CANNOT_ISOLATE, refused.stderr[-2000:]
        lines = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
        assert len(lines) == 1, refused.stderr[-2000:]
        assert "fs.protected_" in lines[0] and "TOOLQ_SANDBOX_HOST_HARDENING=off" in lines[0]
        assert read_host_sysctls() == found

        env["TOOLQ_SANDBOX_HOST_HARDENING"] = "set"
        started = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
        try:
            assert started.stderr is not None
            said: list[str] = []
            reader = threading.Thread(
                target=lambda: said.extend(iter(started.stderr.readline, "")),  # type: ignore[union-attr]
                daemon=True,
            )
            reader.start()
            wait_for(
                lambda: (
                    any("set fs.protected_" in line for line in said) or started.poll() is not None
                ),
                timeout=120,
                what="the worker to say it set the sysctls",
            )
            assert started.poll() is None, "".join(said)[-2000:]
            assert host_is_hardened()
        finally:
            started.terminate()
            started.wait(60)


def test_a_command_sees_only_its_own_runs_processes(config: SandboxConfig) -> None:
    if config.settings.isolation != "process":
        pytest.skip("a PID namespace hides the other runs' processes already")
    root = Path(str(config.workspace_root))
    attacker = prepare_workspace(root / "run-attacker", config)
    victim = prepare_workspace(root / "run-victim", config)
    assert victim.owner is not None
    marker = f"toolq-victim-{os.getpid()}"
    # The victim's call runs until the attacker has looked (or for at most 30 s).
    gate = Path(str(victim.root)) / "gate"
    ended: list[object] = []
    victim_call = threading.Thread(
        target=lambda: ended.append(
            run_in_workspace(
                config,
                victim,
                f": {marker}; i=0; while [ ! -e gate ] && [ $i -lt 300 ]; do sleep 0.1; "
                "i=$((i+1)); done",
            )
        ),
        daemon=True,
    )
    victim_call.start()
    try:
        wait_for(lambda: pids_with(marker) != [], timeout=30, what="the victim's command to start")
        seen = pids_with(marker)

        answer = run_in_workspace(
            config,
            attacker,
            "ps -eo pid,uid,args; ls /proc; cat /proc/[0-9]*/cmdline 2>/dev/null | tr '\\0' ' '",
        )
    finally:
        gate.touch()
        victim_call.join(60)

    assert answer.exit_code == 0, answer.stderr
    assert LAYER_HIDDEN_PROCESSES in answer.isolation
    assert "ps -eo" in answer.stdout  # its own processes are there
    assert marker not in answer.stdout
    listed = set(answer.stdout.split())
    assert not {str(pid) for pid in seen} & listed
    assert str(os.getpid()) not in listed  # nor the worker's
    assert str(victim.owner[0]) not in listed
    assert ended, "the victim's call did not end"


def test_a_hardening_it_does_not_know_is_refused_naming_the_choices() -> None:
    with pytest.raises(ValueError, match="Input should be 'set', 'check' or 'off'"):
        SandboxConfig(one_uid(host_hardening="maybe"))
