"""A run's uid has a name inside its view: ``id -un`` and ``whoami`` answer ``toolq-run``, its
home is the workspace; the machine's /etc/passwd is unchanged, and the run cannot change its
own copy."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from tests.worker.conftest import run_in_workspace
from worker.sandbox import SandboxConfig
from worker.sandbox.identity import release
from worker.sandbox.names import RUN_USER, group_text, passwd_text
from worker.tools.factory import prepare_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need a root worker")


def _digest(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def test_each_run_finds_its_own_uid_by_name(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    passwd, group = _digest("/etc/passwd"), _digest("/etc/group")
    runs = [prepare_workspace(root / name, config) for name in ("run-a", "run-b")]
    for turn in range(3):  # after the first call, a launch may be made ahead for each run
        for workspace in runs:
            result = run_in_workspace(
                config, workspace, "id -un; whoami; id -gn; id -u; echo ~; ls -ln . >/dev/null"
            )
            assert result.exit_code == 0, (turn, result.stderr)
            assert result.stderr == ""
            assert workspace.owner is not None
            assert result.stdout.split() == [
                RUN_USER,
                RUN_USER,
                RUN_USER,
                str(workspace.owner[0]),
                str(workspace.root),
            ]
    assert (_digest("/etc/passwd"), _digest("/etc/group")) == (passwd, group)


def test_a_run_cannot_change_its_name_or_take_root(config: SandboxConfig) -> None:
    """As an attacker: rewrite the copy bound over /etc/passwd (root with no password), unmount
    it, or reach the worker's copy by its path; the machine's files stay as they were."""
    root = Path(str(config.workspace_root))
    passwd = _digest("/etc/passwd")
    workspace = prepare_workspace(root / "run-attacker", config)
    attempts = {
        "echo 'root::0:0::/:/bin/sh' >> /etc/passwd": "write the copy",
        "umount /etc/passwd": "unmount the copy",
        f"echo x >> {root}/.toolq/names/run-attacker/passwd": "write the worker's copy",
        f"ls {root}/.toolq/names": "list the copies",
    }
    for command, what in attempts.items():
        result = run_in_workspace(config, workspace, command)
        assert result.exit_code != 0, f"the run could {what}: {result.stdout}"
    seen = run_in_workspace(config, workspace, f"grep -c '^{RUN_USER}:' /etc/passwd; id -un")
    assert seen.stdout.split() == ["1", RUN_USER], seen.stderr
    assert _digest("/etc/passwd") == passwd


def test_the_names_go_with_the_workspace(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-gone", config)
    assert run_in_workspace(config, workspace, "id -un").exit_code == 0
    names = root / ".toolq" / "names" / "run-gone"
    assert (names / "passwd").is_file()
    assert workspace.owner is not None
    release(root, "run-gone", workspace.owner[0])

    assert not names.exists()


def test_the_copies_replace_a_line_of_the_same_uid_or_name() -> None:
    host = "root:x:0:0::/root:/bin/bash\nold:x:2001:2001::/:/bin/sh\ntoolq-run:x:7:7::/:/bin/sh\n"

    copy = passwd_text(host, 2001, 2001, "/w/run-1").splitlines()

    assert copy == [
        "root:x:0:0::/root:/bin/bash",
        "toolq-run:x:2001:2001:toolq run:/w/run-1:/bin/sh",
    ]
    assert group_text("root:x:0:\nold:x:2001:\n", 2001).splitlines() == [
        "root:x:0:",
        "toolq-run:x:2001:",
    ]
