"""A uid passed from one run to the next: what the kernel kept for it is gone first, or the uid
is kept aside; and each call's keys are its own. Real processes of real uids, real keyrings and
SysV IPC objects."""

from __future__ import annotations

import logging
import os
import secrets
import subprocess
import tempfile
from pathlib import Path

import pytest

from tests.worker.conftest import run_in_workspace
from worker.contract.uid_range import UidRange
from worker.exceptions import IdentityError
from worker.sandbox import SandboxConfig
from worker.sandbox.identity import identity_of, release
from worker.sandbox.uid_reset import hand_over, reset_uid
from worker.sandbox.uid_use import note_used
from worker.tools.factory import prepare_workspace

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="acting as other uids needs root")

SECRET = f"toolq-kept-{secrets.token_hex(6)}"
#: As the uid: a key in each of its keyrings, a SysV segment and message queue, files at the top
#: of the host's shared folders; prints the files' names.
PLANT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
secret, tag = sys.argv[1].encode(), sys.argv[2]
for ring in (-4, -5):
    assert libc.syscall(L(248), b"user", b"toolq-kept", secret, L(len(secret)), L(ring)) >= 0
assert libc.shmget(0, 1 << 20, 0o1000 | 0o600) >= 0
assert libc.msgget(0, 0o1000 | 0o600) >= 0
for folder in ("/tmp", "/var/tmp", "/dev/shm", "/run/lock"):
    path = f"{folder}/toolq-kept-{tag}"
    with open(path, "wb") as planted:
        planted.write(secret)
    print(path)
"""
#: As the uid: the keys it can still find by name, in its user and user-session keyrings.
FIND_KEYS = r"""
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
print([ring for ring in (-4, -5)
       if libc.syscall(L(250), L(10), L(ring), b"user", b"toolq-kept", L(0)) >= 0])
"""
#: A command that adds a key to its session keyring, then lists what that keyring holds.
KEY_IN_SESSION = (
    'python3 -c "import ctypes; L = ctypes.c_long; libc = ctypes.CDLL(None); '
    "print(libc.syscall(L(250), L(10), L(-3), b'user', b'toolq-call', L(0)) >= 0); "
    "libc.syscall(L(248), b'user', b'toolq-call', b'x', L(1), L(-3))\""
)


def _free_uid() -> int:
    """A uid no process or file of this machine uses, far from the runs' range."""
    return 1_900_000_000 + secrets.randbelow(1_000_000)


def _as(uid: int, script: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/python3", "-c", script, *args],
        user=uid, group=uid, extra_groups=[], cwd="/", env={}, capture_output=True, text=True,
        timeout=30, check=False,
    )  # fmt: skip


def _sysv_of(uid: int) -> list[str]:
    found = []
    for kind in ("shm", "msg", "sem"):
        lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        names = lines[0].split()
        rows = [dict(zip(names, line.split(), strict=False)) for line in lines[1:]]
        found += [kind for row in rows if int(row["uid"]) == uid]
    return found


def test_a_reset_uid_keeps_nothing_its_last_run_left() -> None:
    uid = _free_uid()
    planted = _as(uid, PLANT, SECRET, secrets.token_hex(4))
    assert planted.returncode == 0, planted.stderr
    files = planted.stdout.split()
    lingering = subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])
    try:
        assert _sysv_of(uid) == ["shm", "msg"]
        assert _as(uid, FIND_KEYS).stdout.strip() == "[-4, -5]"

        left = reset_uid(uid)

        assert left == []
        assert _as(uid, FIND_KEYS).stdout.strip() == "[]"
        assert _sysv_of(uid) == []
        assert [path for path in files if os.path.lexists(path)] == []
        assert lingering.wait(10) == -9
    finally:
        lingering.kill()
        lingering.wait(timeout=30)
        reset_uid(uid)


def test_a_uid_whose_processes_are_all_gone_still_loses_all_they_left() -> None:
    # The run's last process exited before its workspace went: the reset finds no process to
    # end, and must still leave nothing of the uid's behind.
    uid = _free_uid()
    planted = _as(uid, PLANT, SECRET, secrets.token_hex(4))
    assert planted.returncode == 0, planted.stderr
    files = planted.stdout.split()
    try:
        assert _sysv_of(uid) == ["shm", "msg"]

        assert reset_uid(uid) == []

        assert _as(uid, FIND_KEYS).stdout.strip() == "[]"
        assert _sysv_of(uid) == []
        assert [path for path in files if os.path.lexists(path)] == []
    finally:
        reset_uid(uid)


def test_a_uid_that_cannot_be_shown_clean_is_kept_aside(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    uid = _free_uid()
    uids = UidRange.parse(f"{uid}-{uid}")
    root = tmp_path / "workspaces"
    assert identity_of(root, "run-a", uids) == (uid, uid)
    note_used(root, uid)  # as the run's first command does
    # A folder of the uid's in /tmp that no reset can remove: something is mounted on it.
    stuck = Path(tempfile.mkdtemp(prefix="toolq-stuck-", dir="/tmp"))
    os.chown(stuck, uid, uid)
    options = f"size=1m,uid={uid},gid={uid}"
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(stuck)], check=True, timeout=30
    )
    try:
        with caplog.at_level(logging.WARNING, logger="worker.sandbox.identity"):
            release(root, "run-a", uid)

        assert f"uid {uid} is quarantined" in caplog.text
        assert str(stuck) in caplog.text
        for run in ("run-b", "run-a"):  # nor the old run's id again: its workspace is gone
            with pytest.raises(IdentityError, match="no free uid"):
                identity_of(root, run, uids)
    finally:
        subprocess.run(["umount", str(stuck)], check=False, timeout=30)
        stuck.rmdir()


def test_each_call_has_a_session_keyring_of_its_own(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-keys", config)
    seen = [run_in_workspace(config, workspace, KEY_IN_SESSION) for _ in range(3)]

    # Each call adds a key to its session keyring: none finds one a call before it added.
    assert [result.stdout.strip() for result in seen] == ["False"] * 3, seen
    assert "session-keyring" in seen[0].isolation


def test_a_uid_is_reset_when_another_holder_comes_not_between_its_own_calls(
    tmp_path: Path,
) -> None:
    state = str(tmp_path / "host-state")
    uid = _free_uid()
    planted = _as(uid, PLANT, SECRET, secrets.token_hex(4))
    assert planted.returncode == 0, planted.stderr
    try:
        hand_over(state, uid, "run-a")  # the uid's first holder here: whatever was before goes
        assert _as(uid, FIND_KEYS).stdout.strip() == "[]"
        assert _as(uid, PLANT, SECRET, secrets.token_hex(4)).returncode == 0

        hand_over(state, uid, "run-a")  # its own next call: what it keeps is its own
        kept = _as(uid, FIND_KEYS).stdout.strip()
        # run-b's container, started before its first command: the hand-over leaves it be.
        container = subprocess.Popen(["sleep", "300"], user=uid, group=uid, extra_groups=[])
        hand_over(state, uid, "run-b")  # another run given the uid: nothing of run-a's is left

        assert kept == "[-4, -5]"
        assert _as(uid, FIND_KEYS).stdout.strip() == "[]"
        assert _sysv_of(uid) == []
        assert container.poll() is None
        reset_uid(uid)  # its workspace removed: its processes go too
        assert container.wait(10) == -9
    finally:
        reset_uid(uid)
