"""What the kernel keeps for a uid after its run is over, reset before the uid serves another run.

A run's uid outlives its calls in the kernel's tables: keys in the uid's user keyrings, SysV
shared memory, semaphores and message queues it owns, POSIX message queues, files at the top of
the host's folders every uid can write (``/tmp``, ``/run/lock``...), and any process a call left.
A run later given the same uid would own all of it. ``reset_uid`` removes it and then looks again:
what it cannot show gone is named, and the uid is not handed on (``identity.release`` keeps its
claim aside; ``hand_over`` refuses the call).

Keyrings and IPC objects belong to the worker's user and IPC namespaces, which the process that
removes a run's workspace may not share (the deploy's pools each have their own). So the reset
runs twice: where the workspace is removed (``identity.release``), and in the sandbox worker as
the first call of another run comes for the uid (``hand_over``), in the worker's own user and IPC
namespaces.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import shutil
import stat
import time
from pathlib import Path

from worker.exceptions import SandboxError
from worker.plumbing.proc_stat import process_alive
from worker.sandbox.keyrings import clear_uid_keyrings
from worker.sandbox.pidfd_kill import kill_until_gone, owned_by, processes

#: The host's folders every uid can write, whose top a run's uid may have left files in.
WRITABLE_BY_ALL = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/dev/mqueue")
#: The kernel's tables of SysV IPC objects (in this IPC namespace): the owner's and creator's
#: uid columns, and how each kind is removed.
_SYSVIPC = {"shm": ("shmctl", 0), "msg": ("msgctl", 0), "sem": ("semctl", 1)}
_IPC_RMID = 0
#: How long the processes of a uid may take to die, and its shared memory to go with them.
RESET_BOUND_S = 5.0
#: The folder, in the host's sandbox state (``TOOLQ_SANDBOX_HOST_STATE``, the workers' alone),
#: where the sandbox workers note which holder each uid served last on this host.
HOLDERS = "uid-holders"


def reset_uid(uid: int, *, end_processes: bool = True) -> list[str]:
    """Remove what ``uid`` left in this worker's namespaces and on this host, then look again
    (where a process of the uid could have made something meanwhile); returns what is still
    there (empty: nothing of the uid is left). ``end_processes``: its processes are ended and
    counted too."""
    deadline = time.monotonic() + RESET_BOUND_S
    # Processes first: a live one could make again what is removed after it.
    ended = end_processes and bool(_processes_of(uid))
    if ended:
        kill_until_gone(lambda: _processes_of(uid), owned_by(uid), deadline)
    for kind, ident in _ipc_objects_of(uid):
        _remove_ipc(kind, ident)
    kept = [f"{folder}/{name}" for folder in WRITABLE_BY_ALL for name in remove_owned(folder, uid)]
    keyrings_left = clear_uid_keyrings(uid)
    left: list[str] = []
    # Where processes were ended (or are not ours to end), one may have made something since:
    # everything is looked at again. Where the uid had none, nothing of it can have come since
    # (a process of a uid is made by another of it, or by a call of its run, and none runs as
    # its workspace goes): what could not be removed is what is left.
    look_again = ended or not end_processes
    if ended and (processes := _processes_of(uid)):
        left.append(f"{len(processes)} process(es)")
    # A shared memory segment still attached goes with its last process, which was just killed.
    while (objects := _ipc_objects_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.01)
    if objects:
        left.append(f"SysV IPC objects {', '.join(f'{kind} {ident}' for kind, ident in objects)}")
    if look_again:
        kept = [
            f"{folder}/{name}" for folder in WRITABLE_BY_ALL for name in _owned_entries(folder, uid)
        ]
    left += kept
    if keyrings_left is not None:
        left.append(keyrings_left)
    return left


def _processes_of(uid: int) -> list[int]:
    """The live processes of ``uid``: a zombie, dead but not yet reaped by its parent, holds
    nothing a run could use."""
    return [pid for pid, owner in processes() if owner == uid and process_alive(pid)]


def _ipc_objects_of(uid: int) -> list[tuple[str, int]]:
    """The SysV IPC objects of this IPC namespace that ``uid`` owns or made, as (kind, id)."""
    found = []
    for kind in _SYSVIPC:
        try:
            lines = Path(f"/proc/sysvipc/{kind}").read_text().splitlines()
        except OSError:
            continue
        if not lines:
            continue
        names = lines[0].split()
        for line in lines[1:]:
            row = dict(zip(names, line.split(), strict=False))
            with contextlib.suppress(KeyError, ValueError):
                if uid in (int(row["uid"]), int(row["cuid"])):
                    found.append((kind, int(row[f"{kind}id" if kind != "msg" else "msqid"])))
    return found


def _remove_ipc(kind: str, ident: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    function, arguments_before = _SYSVIPC[kind]
    if arguments_before:  # semctl(id, semnum, cmd)
        getattr(libc, function)(ident, 0, _IPC_RMID, None)
    else:
        getattr(libc, function)(ident, _IPC_RMID, None)


def _owned_entries(folder: str, uid: int) -> list[str]:
    """The names at the top of ``folder`` that ``uid`` owns, links never followed."""
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        return [entry.name for entry in entries if _owner(entry) == uid]
    return []


def remove_owned(folder: str, uid: int) -> list[str]:
    """Remove the entries of ``folder`` (not below) that ``uid`` owns, links never followed;
    the names of those that could not be removed."""
    try:
        dir_fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        with os.scandir(dir_fd) as entries:
            owned = [
                (entry.name, entry.is_dir(follow_symlinks=False))
                for entry in entries
                if _owner(entry) == uid
            ]
        kept: list[str] = []
        for name, is_dir in owned:
            try:
                if is_dir:
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)
            except FileNotFoundError:
                continue  # gone already
            except OSError:
                kept.append(name)
    finally:
        os.close(dir_fd)
    return kept


def _owner(entry: os.DirEntry[str]) -> int | None:
    try:
        return entry.stat(follow_symlinks=False).st_uid
    except OSError:
        return None


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
