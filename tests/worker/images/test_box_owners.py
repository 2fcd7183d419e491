"""Whose a run's container is, as the sweeps of two fleets sharing one image cache on one host
see it: its worker is alive while its lock in the host's registry is held, from whatever PID
namespace it runs in, and another fleet's sweep never ends it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.bounded import read_line
from tests.conftest import REPO
from tests.worker.conftest import one_uid
from worker.images import owner as owner_module
from worker.images.boxes import BoxRecord
from worker.images.owner import Owner, set_worker
from worker.images.sweep import _why_end
from worker.sandbox import SandboxConfig

#: A sandbox worker's main process: says whose its boxes are, and lives until its input closes.
_WORKER = r"""
import sys
from worker.images.owner import current_owner, set_worker
from worker.sandbox import SandboxConfig, SandboxSettings
settings = SandboxSettings(uid_range="", host_state=sys.argv[2])
set_worker("sandbox-x@host", SandboxConfig(settings, workspace_root=sys.argv[1]))
print(current_owner().model_dump_json(), flush=True)
sys.stdin.read()
"""


def _start(root: Path, host: Path, *unshare: str) -> tuple[subprocess.Popen[str], Owner]:
    proc = subprocess.Popen(
        [*unshare, sys.executable, "-c", _WORKER, str(root), str(host)],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, Owner.model_validate_json(read_line(proc, "the owner to say who it is"))


def _end(proc: subprocess.Popen[str]) -> None:
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.wait(10)
    proc.stdout.close()


def test_a_worker_in_its_own_pid_namespace_is_alive_to_every_sweep(tmp_path: Path) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("a PID namespace of its own needs root and unshare")
    root = tmp_path / "workspaces"
    root.mkdir()
    proc, owner = _start(root, tmp_path / "host", "unshare", "--pid", "--fork", "--mount-proc")
    try:
        # Its pid is its namespace's: here it names another process, or none.
        assert owner.alive()
    finally:
        _end(proc)
    assert not owner.alive()


def test_a_sweep_never_ends_another_fleets_box(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first, second = tmp_path / "fleet-a", tmp_path / "fleet-b"
    first.mkdir()
    second.mkdir()
    host = tmp_path / "host"
    proc, owner = _start(first, host)
    _end(proc)  # fleet A's worker is gone, and so is the workspace of its run
    record = BoxRecord(
        name="toolq-box",
        run_id="run-a",
        image="img",
        digest="sha256:0",
        runtime="runc",
        owner=owner,
        workspace=str(first / "run-a"),
        workspace_id=(0, 0),
        workdir="/",
        user=(0, 0),
        env=[],
        cgroups_path="/toolq-images/toolq-box",
        init_pid=1,
        start_ms=0,
        pulled=False,
    )
    # This process as the sweeping worker of each fleet in turn.
    monkeypatch.setattr(owner_module, "_worker", [])
    set_worker("sandbox-b@host", _config(second, host))
    assert _why_end(record) is None
    set_worker("sandbox-a@host", _config(first, host))
    assert _why_end(record) == "its worker sandbox-x@host is gone"


def _config(root: Path, host: Path) -> SandboxConfig:
    return SandboxConfig(one_uid(host_state=str(host)), workspace_root=str(root))
