"""The sandbox worker's side of a uid passing from one run to another on its host: the first
call of a new holder resets what the kernel keeps for the uid here (``uid_reset``), in the
worker's own user and IPC namespaces, which the process that removed the old run's workspace may
not share.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
from pathlib import Path

from worker.exceptions import SandboxError
from worker.sandbox.uid_reset import reset_uid

#: The folder, in the host's sandbox state (``TOOLQ_SANDBOX_HOST_STATE``, the workers' alone),
#: where the sandbox workers note which holder each uid served last on this host.
HOLDERS = "uid-holders"


def hand_over(host_state: str, uid: int, holder: str) -> None:
    """Before a call of ``holder`` (its workspace, as ``holder_of`` names it) runs as ``uid`` on
    this host (whose sandbox state is in ``host_state``): when the uid last served another
    holder here, reset it first. Raises ``SandboxError`` when the uid cannot be shown clean: the
    call does not run."""
    record = _record(Path(host_state) / HOLDERS, uid)
    try:
        fcntl.flock(record, fcntl.LOCK_EX)
        with os.fdopen(os.dup(record), "rb") as current:
            served = current.read()
        if served == holder.encode():
            return
        # Its processes stay: those of the old run ended with its calls, and were ended again
        # where its workspace was removed; any here now may be the new holder's own (the
        # container of its image, started before this call).
        left = reset_uid(uid, end_processes=False)
        if left:
            raise SandboxError(
                f"uid {uid} still holds what an earlier run left ({'; '.join(left)}): "
                "it serves no other run until that is gone"
            )
        os.ftruncate(record, 0)
        os.pwrite(record, holder.encode(), 0)
    finally:
        os.close(record)


def holder_of(workspace: Path) -> str:
    """A workspace as a holder of its uid: its path, and which folder is there now (a workspace
    removed and made again under the same name is another holder)."""
    try:
        info = os.stat(workspace)
    except OSError:
        return f"{workspace}\0missing"
    return f"{workspace}\0{info.st_dev}:{info.st_ino}"


def _record(holders: Path, uid: int) -> int:
    """The open file noting which holder ``uid`` served last on this host: in ``holders``, a
    folder that is the workers' alone, made if missing."""
    with contextlib.suppress(FileExistsError):
        holders.mkdir(mode=0o700, parents=True)
    info = os.lstat(holders)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o077:
        raise SandboxError(f"{holders} is not a folder of the worker's alone; remove it")
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC
    return os.open(holders / str(uid), flags, 0o600)
