"""A uid that never ran anything is let go without a reset; one that did is reset in full when
its run's workspace goes, and the note that says so is out of the run's reach. Real commands of
real uids, real keyrings, SysV IPC objects and processes."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path

import pytest

from tests.worker.conftest import run_in_workspace
from tests.worker.test_uid_reset import FIND_KEYS, PLANT, SECRET, _as, _sysv_of
from worker.retention import prune
from worker.sandbox import SandboxConfig
from worker.sandbox.identity import claims_dir
from worker.sandbox.uid_reset import reset_uid
from worker.sandbox.uid_use import USED, was_used
from worker.state_folder import STATE_DIR
from worker.tools.factory import prepare_workspace
from worker.tools.workspace import Workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as other uids needs root")

#: A process of the uid that left its call behind: its own session, its parent gone.
ESCAPED = "import os, time\nif os.fork() == 0:\n    os.setsid()\n    time.sleep(300)\n"


def _run(config: SandboxConfig, run_id: str) -> tuple[Path, Workspace, int]:
    """The workspace root, and the workspace and uid of run ``run_id`` made ready there."""
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / run_id, config)
    assert workspace.owner is not None
    return root, workspace, workspace.owner[0]


def test_a_uid_that_ran_a_command_loses_all_it_left_when_its_workspace_goes(
    config: SandboxConfig,
) -> None:
    root, workspace, uid = _run(config, "run-used")
    try:
        assert run_in_workspace(config, workspace, "echo ran").exit_code == 0
        # What a command of the run left that outlived its call: keys in the uid's keyrings,
        # SysV shared memory and a message queue, files at the top of /tmp and its like, and
        # a process in a session of its own whose parent is gone.
        planted = _as(uid, PLANT, SECRET, secrets.token_hex(4))
        assert planted.returncode == 0, planted.stderr
        files = planted.stdout.split()
        escaped = subprocess.Popen(
            ["/usr/bin/python3", "-c", ESCAPED], user=uid, group=uid, extra_groups=[]
        )
        assert escaped.wait(10) == 0
        assert _sysv_of(uid) == ["shm", "msg"]

        removed = prune(root, 0.0)

        assert [expired.removed for expired in removed] == [True]
        assert _as(uid, FIND_KEYS).stdout.strip() == "[]"
        assert _sysv_of(uid) == []
        assert [path for path in files if os.path.lexists(path)] == []
        assert _processes_of(uid) == []
        assert not (claims_dir(root) / str(uid)).exists()  # free again, and clean
        assert not was_used(root, uid)
    finally:
        reset_uid(uid)


def test_a_run_cannot_remove_nor_forge_the_note_that_its_uid_ran_something(
    config: SandboxConfig,
) -> None:
    root, workspace, uid = _run(config, "run-forger")
    notes = root / STATE_DIR / USED
    other = uid + 1
    try:
        attack = run_in_workspace(
            config,
            workspace,
            f"rm -f {notes}/{uid}; rm -rf {notes}; touch {notes}/{other}; ls {notes}; "
            f"mv {notes} {notes}.gone",
        )

        assert "Permission denied" in attack.stderr or "No such file" in attack.stderr, attack
        assert attack.stdout.strip() == ""  # the notes cannot even be listed
        assert sorted(os.listdir(notes)) == [str(uid)]  # its own stays; no other's was made
        assert was_used(root, uid)
    finally:
        prune(root, 0.0)
        reset_uid(uid)


def test_a_run_of_file_tools_alone_is_let_go_with_nothing_noted(config: SandboxConfig) -> None:
    root, workspace, uid = _run(config, "run-files")
    (workspace.root / "notes.txt").write_text("written by a file tool\n")

    assert not was_used(root, uid)
    assert [expired.removed for expired in prune(root, 0.0)] == [True]

    assert not (claims_dir(root) / str(uid)).exists()
    assert not was_used(root, uid)


def _processes_of(uid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid and b"Z" not in _state(entry):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def _state(entry: Path) -> bytes:
    return (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
