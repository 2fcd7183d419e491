"""The fleet secret that seals answers: made once per user where none is set, out of other
users' reach; a file set by the operator refused in one line when it is unfit; a key per call."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from api.local.stack import worker_argv
from worker.contract.errors import FleetSecretError
from worker.contract.fleet_secret import FleetSecret, default_secret_file, fleet_secret
from worker.contract.settings import WorkerSettings
from worker.contract.settings_check import EXIT_BAD_SETTINGS

NOBODY = 65534


@pytest.fixture
def state_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(home))
    return home


def test_without_a_setting_one_secret_is_made_for_the_user_and_kept_private(
    state_home: Path,
) -> None:
    first = fleet_secret(None)
    assert first.path == state_home / "toolq" / "fleet-secret" == default_secret_file()
    assert stat.S_IMODE(first.path.stat().st_mode) == 0o600
    assert stat.S_IMODE(first.path.parent.stat().st_mode) == 0o700
    assert fleet_secret(None) == first  # every process of the user reads the same


@pytest.mark.skipif(os.geteuid() != 0, reason="drops to another uid")
def test_another_user_such_as_a_runs_uid_cannot_read_the_default_secret(
    state_home: Path,
) -> None:
    made = fleet_secret(None)
    os.chmod(state_home, 0o755)  # even with every folder above it open
    os.chmod(state_home.parent, 0o755)
    read = subprocess.run(
        ["cat", str(made.path)],
        user=NOBODY,
        group=NOBODY,
        extra_groups=[],
        capture_output=True,
        check=False,
        timeout=30,
    )
    assert read.returncode != 0 and made.value not in read.stdout


def test_each_call_has_its_own_key_and_each_fleet_its_own() -> None:
    ours = FleetSecret(b"a" * 32, Path("ours"))
    theirs = FleetSecret(b"b" * 32, Path("theirs"))
    assert ours.seal_key("call-1") != ours.seal_key("call-2")
    assert ours.seal_key("call-1") != theirs.seal_key("call-1")
    assert ours.secret_id != theirs.secret_id
    assert b"a" * 32 not in repr(ours).encode()


@pytest.mark.parametrize(
    ("content", "mode", "why"),
    [
        pytest.param(b"x" * 64, 0o644, "other users can read it (mode 0644)", id="readable"),
        pytest.param(b"short", 0o600, "holds 5 bytes", id="too-short"),
        pytest.param(None, 0o600, "cannot be read", id="missing"),
    ],
)
def test_an_unfit_secret_file_is_refused_in_one_line_naming_the_setting(
    tmp_path: Path, content: bytes | None, mode: int, why: str
) -> None:
    path = tmp_path / "secret"
    if content is not None:
        path.write_bytes(content)
        path.chmod(mode)
    with pytest.raises(FleetSecretError) as refused:
        fleet_secret(path)
    message = str(refused.value)
    assert message.startswith(f"TOOLQ_FLEET_SECRET_FILE {path}: ") and why in message
    assert "\n" not in message


def test_a_worker_given_an_unfit_secret_file_refuses_to_start_in_one_line(
    tmp_path: Path,
) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"x" * 64)
    path.chmod(0o644)
    env = {
        **os.environ,
        "TOOLQ_BROKER_URL": "redis://127.0.0.1:1/0",
        "TOOLQ_WORKSPACE_ROOT": str(tmp_path / "workspaces"),
        "TOOLQ_FLEET_SECRET_FILE": str(path),
    }
    argv = worker_argv("tools", node="unfit@%h")
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == EXIT_BAD_SETTINGS, done.stderr
    [line] = [text for text in done.stderr.splitlines() if text.startswith("error:")]
    assert line == (
        f"error: TOOLQ_FLEET_SECRET_FILE {path}: other users can read it (mode 0644); make it "
        "0600, 0400 or 0440 (a Kubernetes Secret: defaultMode: 0440)"
    )


def test_a_file_the_operator_set_is_used_whole(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    path.write_bytes(b"s" * 40 + b"\n")
    path.chmod(0o400)
    assert fleet_secret(path).value == b"s" * 40
    assert WorkerSettings(fleet_secret_file=path).fleet_secret_file == path
