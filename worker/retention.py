"""How long run workspaces live: every call touches its run's workspace and holds it while it
runs; a workspace no call touched for ``TOOLQ_WORKSPACE_TTL_S`` is removed, by the workers now
and then or by ``toolq prune``, and a run's caller may remove its own (the service operation
``toolq.remove_workspace``, whose call turns its own hold exclusive), but never while another
call of its run is in flight.

A call holds a shared lock on the workspace folder; removal takes the exclusive lock without
waiting (a run with a call in flight is skipped), moves the folder aside while holding it, and
deletes it there. A call that opened the folder just before it moved finds it replaced and
starts again on a new one.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from worker.contract.wire import RUN_ID_PATTERN
from worker.exceptions import WorkspaceGone
from worker.quota import WorkspaceQuota, measure
from worker.sandbox.identity import release
from worker.sandbox.volumes import release_volume
from worker.state_folder import STATE_DIR

_RUN_ID = re.compile(RUN_ID_PATTERN)
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
#: Where removed workspaces wait to be deleted, out of every call's way.
TRASH = "trash"
#: Why a workspace stays: a call of its run holds it.
IN_FLIGHT = "a call of the run is in flight"


def hold(workspace: Path) -> int:
    """Touch ``workspace`` and keep it from removal until the returned descriptor is closed;
    raises ``WorkspaceGone`` when it was removed (or is being removed) meanwhile."""
    try:
        fd = os.open(workspace, _DIR_FLAGS)
    except FileNotFoundError:
        raise WorkspaceGone(str(workspace)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH)
        held = os.fstat(fd)
        current = os.stat(workspace, follow_symlinks=False)
        if (current.st_dev, current.st_ino) != (held.st_dev, held.st_ino):
            raise FileNotFoundError(str(workspace))
        with contextlib.suppress(PermissionError):  # a folder of another user's: not ours to date
            os.utime(fd)  # last touched: now
    except FileNotFoundError:
        os.close(fd)
        raise WorkspaceGone(str(workspace)) from None
    except BaseException:
        os.close(fd)
        raise
    return fd


@dataclass(frozen=True, slots=True)
class Expired:
    """A run workspace past its lifetime: removed, or (in a dry run) to be removed."""

    run_id: str
    idle_s: float
    size_bytes: int | None
    removed: bool
    #: Why it stays although expired: a call of its run is in flight.
    skipped: str | None = None


def prune(
    root: Path,
    older_than_s: float,
    *,
    dry_run: bool = False,
    sizes: bool = False,
    quota: WorkspaceQuota | None = None,
    now: float | None = None,
) -> list[Expired]:
    """Remove the run workspaces under ``root`` no call touched for ``older_than_s`` seconds."""
    now = time.time() if now is None else now
    found: list[Expired] = []
    for name in run_ids(root):
        try:
            idle = now - os.stat(root / name, follow_symlinks=False).st_mtime
        except FileNotFoundError:
            continue
        if idle < older_than_s:
            continue
        size = measure(root / name).used_bytes if sizes else None
        if dry_run:
            found.append(Expired(name, idle, size, removed=False))
            continue
        skipped = _remove(root, name, older_than_s, now)
        if skipped is None and quota is not None:
            quota.forget(name)
        found.append(Expired(name, idle, size, removed=skipped is None, skipped=skipped))
    return found


def _remove(root: Path, name: str, older_than_s: float, now: float) -> str | None:
    """Remove one workspace unless a call holds it; why not, or None once removed."""
    path = root / name
    try:
        fd = os.open(path, _DIR_FLAGS)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return IN_FLIGHT
        held = os.fstat(fd)
        if now - held.st_mtime < older_than_s:
            return "touched meanwhile"
        aside = _move_aside(root, name)
    finally:
        os.close(fd)
    _delete(root, name, aside, held.st_gid)
    return None


def remove_held(root: Path, name: str, held: int) -> str | None:
    """Remove the workspace ``name`` that the calling call holds by ``held`` (its descriptor
    from ``hold``), unless another call holds it too; why not, or None once removed."""
    try:
        # The call's own shared lock made exclusive, which no other holder allows.
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        # Linux lets go of the shared lock before it tries: the call holds it again.
        fcntl.flock(held, fcntl.LOCK_SH)
        return IN_FLIGHT
    try:
        info = os.fstat(held)
        try:
            current = os.stat(root / name, follow_symlinks=False)
        except FileNotFoundError:
            return None
        if (current.st_dev, current.st_ino) != (info.st_dev, info.st_ino):
            return None  # removed by another between the two locks; a new run's folder is there
        aside = _move_aside(root, name)
    finally:
        # Calls waiting to hold the folder go on at once, find it moved and make a new one.
        fcntl.flock(held, fcntl.LOCK_UN)
    _delete(root, name, aside, info.st_gid)
    return None


def _move_aside(root: Path, name: str) -> Path:
    """Move a workspace its remover holds exclusively out of every call's way."""
    trash = root / STATE_DIR / TRASH
    trash.mkdir(parents=True, exist_ok=True)
    aside = trash / f"{name}.{uuid.uuid4().hex[:8]}"
    # A run's volume is unmounted first (a mount point cannot be moved), and its image goes.
    release_volume(root, name, root / name)
    os.rename(root / name, aside)
    return aside


def _delete(root: Path, name: str, aside: Path, gid: int) -> None:
    shutil.rmtree(aside, ignore_errors=True)
    # The run's uid (its folder's group: the uid and gid of a run are one number) is free again
    # for another run, with its /tmp gone (its processes ended with its last call).
    release(root, name, gid)


def run_ids(root: Path, prefix: str = "") -> list[str]:
    """The runs that have a workspace under ``root`` and an id starting with ``prefix``, sorted
    (none under a root no call has made yet)."""
    with contextlib.suppress(FileNotFoundError), os.scandir(root) as entries:
        return sorted(
            e.name
            for e in entries
            if e.name.startswith(prefix)
            and _RUN_ID.match(e.name)
            and e.is_dir(follow_symlinks=False)
        )
    return []


def empty_trash(root: Path) -> None:
    """Delete what an interrupted removal left aside."""
    trash = root / STATE_DIR / TRASH
    with contextlib.suppress(FileNotFoundError), os.scandir(trash) as entries:
        for entry in entries:
            shutil.rmtree(entry.path, ignore_errors=True)
