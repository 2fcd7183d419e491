"""A file system of its own for each run's workspace, of the quota's size: the kernel stops a
write past ``TOOLQ_WORKSPACE_QUOTA_BYTES`` (``ENOSPC``) instead of the quota finding it after
the call (``TOOLQ_WORKSPACE_QUOTA_FS=loop``).

A run's volume is a sparse ext4 image, ``<root>/.toolq/volumes/<run_id>.img``, loop-mounted at its
workspace on this host, so the tools pool and the sandbox pool of the host see the same files. It
holds only what the run wrote (sparse), is mounted again after a reboot by the first call that
needs it, and goes with the workspace (``release_volume``). Launches made ahead in mount
namespaces of their own copied the host's mounts before a new run's volume was there: a call
hands its launch a detached copy of the volume (``detached_copy``) to attach over its workspace.

Each mounted volume is one mount more on the host, which every new mount namespace copies: it
suits a host that prunes idle workspaces, not one that keeps thousands.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

from worker.exceptions import SandboxError
from worker.sandbox.config import SAFE_PATH
from worker.state_folder import STATE_DIR

VOLUMES = "volumes"
_SYS_OPEN_TREE = 428
_OPEN_TREE_CLONE, _AT_RECURSIVE, _O_CLOEXEC = 1, 0x8000, 0o2000000
_AT_FDCWD = -100


def volumes_unavailable() -> str | None:
    """Why this host cannot give runs volumes of their own, or None."""
    if os.geteuid() != 0:
        return "the worker is not root"
    if not os.access("/dev/loop-control", os.W_OK):
        return "no loop devices (/dev/loop-control)"
    for program in ("mkfs.ext4", "mount", "umount"):
        if shutil.which(program, path=SAFE_PATH) is None:
            return f"{program} is not installed"
    return None


def image_of(root: Path, name: str) -> Path:
    return Path(root) / STATE_DIR / VOLUMES / f"{name}.img"


def ensure_volume(folder: Path, quota_bytes: int, gid: int) -> None:
    """Mount the run's volume at ``folder`` (made, of ``quota_bytes``, if it is new): the
    volume's root then belongs to the worker, in the run's group alone. Raises ``SandboxError``
    saying why it cannot."""
    image = image_of(folder.parent, folder.name)
    image.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    with _locked(image.with_suffix(".lock")):
        if os.path.ismount(folder):
            return
        new = not image.exists()
        if new:
            with open(image, "xb") as sparse:
                sparse.truncate(quota_bytes)
            # No journal and no space kept for root: the run gets what its quota says.
            _run(["mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal", str(image)])
        folder.mkdir(exist_ok=True)
        _run(["mount", "-o", "loop,nosuid,nodev", str(image), str(folder)])
        if new:
            os.rmdir(folder / "lost+found")
            os.chown(folder, os.geteuid(), gid)
            os.chmod(folder, 0o770)  # noqa: S103 - the run's group alone


def release_volume(root: Path, name: str, folder: Path | None = None) -> None:
    """Unmount the run's volume (from ``folder``, where it was mounted) and delete its image."""
    image = image_of(root, name)
    if not image.exists():
        return
    if folder is not None and os.path.ismount(folder):
        _run(["umount", "--lazy", str(folder)])
    image.unlink(missing_ok=True)
    image.with_suffix(".lock").unlink(missing_ok=True)


def detached_copy(folder: str) -> int:
    """A detached copy of the mount at ``folder`` (``open_tree``), which a launch made in a
    mount namespace of its own attaches over its copy of the folder."""
    libc = ctypes.CDLL(None, use_errno=True)
    flags = _OPEN_TREE_CLONE | _AT_RECURSIVE | _O_CLOEXEC
    fd = int(libc.syscall(_SYS_OPEN_TREE, _AT_FDCWD, folder.encode(), flags))
    if fd < 0:
        raise SandboxError(f"cannot copy the mount of {folder}: {os.strerror(ctypes.get_errno())}")
    return fd


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


def _run(argv: list[str]) -> None:
    try:
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env={"PATH": SAFE_PATH},
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"{argv[0]} failed: {exc}") from exc
    if done.returncode != 0:
        raise SandboxError(f"{' '.join(argv[:2])} failed: {done.stderr.strip()[:300]}")
