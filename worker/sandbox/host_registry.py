"""The host's own record of what toolq's sandbox workers hold, shared by every sandbox worker on
the host whatever its fleet, broker, workspace root, PID namespace or isolation mode
(``TOOLQ_SANDBOX_HOST_STATE``, root's alone: mode 0700, so no run reads or plants anything).

- ``uids/<uid>``: the fleet and the run that hold the uid on this host. A fleet's own claim, under
  its workspace root, keeps its runs apart on every host it serves; this one keeps fleets apart
  on one host: a uid another fleet holds here is skipped.
- ``workers/<id>.lock``: one per worker process, naming its fleet and locked (``flock``) by the
  process for its whole life. The kernel lets the lock go when the process dies, seen alike from
  every PID namespace, so what a worker names with its id (its calls' control groups) is provably
  its own and provably left behind once the lock is free. A pid proves neither.
- ``uid-locks/<uid>.lock``: held by the calls of a uid's run that run without namespaces
  (``uid_leftovers``); the sweep of the uid takes it exclusively.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import secrets
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from worker.contract import sandbox_settings
from worker.exceptions import HostRegistryError
from worker.sandbox.fleet_key import existing_fleet_id
from worker.sandbox.pidfd_kill import processes
from worker.state_folder import STATE_DIR

#: Where the registry is unless ``TOOLQ_SANDBOX_HOST_STATE`` says otherwise: a folder of the
#: host's own that a reboot empties, as it empties the kernel state the registry describes.
HOST_STATE = str(sandbox_settings.HOST_STATE)
_UIDS = "uids"
#: Where a fleet claims its uids under its workspace root (``identity.claims_dir``).
_FLEET_CLAIMS = "uids"
_WORKERS = "workers"
_UID_LOCKS = "uid-locks"
_REGISTRY_LOCK = "lock"
#: Held while a process makes a fleet's claim of a uid (``HostRegistry.claiming``).
_CLAIMING_LOCK = "claiming.lock"
_WORKER_SUFFIX = ".lock"
#: A worker id: hex digits only, so it can be part of a control group's name.
WORKER_ID_LENGTH = 16


def default_host_state() -> str:
    """``HOST_STATE`` for root; for another user, who can neither write it nor give runs uids
    (its call groups are in its own part of the hierarchy), a folder of that user's own."""
    euid = os.geteuid()
    return HOST_STATE if euid == 0 else os.path.join(tempfile.gettempdir(), f"toolq-host-{euid}")


@dataclass(frozen=True, slots=True)
class UidHolder:
    """Who holds a uid on this host."""

    fleet: str
    run: str
    #: The fleet's workspace root, as its worker saw it, and that worker's mount namespace.
    where: str = ""
    mounts: str = ""

    def is_(self, fleet: str, run: str) -> bool:
        return (self.fleet, self.run) == (fleet, run)

    def abandoned(self, uid: int) -> bool:
        """Whether the fleet that holds the uid here provably let it go: its worker saw the same
        files as this process (one mount namespace), and there its workspace root is gone, or
        is another fleet's now, or no longer claims the uid. Anything else is left standing."""
        if not self.mounts or self.mounts != _mount_namespace() or not self.where:
            return False
        root = Path(self.where)
        if not root.is_absolute() or any(owner == uid for _, owner in processes()):
            return False  # a process of the uid runs here: whatever the files say, it is held
        if not root.exists():
            return True
        try:
            if existing_fleet_id(root) != self.fleet:
                return True
        except OSError:
            return False
        return not (root / STATE_DIR / _FLEET_CLAIMS / str(uid)).exists()


#: This process's worker id and the descriptor holding its lock, by registry folder and fleet:
#: made again in a forked child, whose parent's lock is not its own.
_mine: dict[tuple[str, str], tuple[int, str, int]] = {}


class HostRegistry:
    """The registry in ``folder``."""

    def __init__(self, folder: str | Path) -> None:
        self.folder = Path(folder)

    def refusal(self) -> str | None:
        """Why this process cannot use the registry (it is made here if missing), or None."""
        try:
            self._ensure()
        except HostRegistryError as exc:
            return str(exc)
        return None

    # -- uids -------------------------------------------------------------------------------

    def claim_uid(self, uid: int, fleet: str, run: str, where: str = "") -> bool:
        """Take ``uid`` on this host for ``run`` of ``fleet``, which holds the fleet's own claim
        of it; False when another fleet holds it here. A claim of the same fleet for another run
        is one its release did not reach (made on another host): the fleet's claim says the uid
        is this run's now, so it is taken over; so is one another fleet provably abandoned
        (``UidHolder.abandoned``). ``where`` (the fleet's workspace root) is noted for that, and
        for the operator, who may remove the claims of a fleet taken off the host."""
        claim = self._ensure() / _UIDS / str(uid)
        holder = self.uid_holder(uid)
        if holder is not None and holder.is_(fleet, run):
            return True  # the run's already: a claim is replaced whole, so this read is sound
        with self._locked():
            holder = self.uid_holder(uid)
            if holder is not None and holder.fleet != fleet and not holder.abandoned(uid):
                return False
            if holder is None or not holder.is_(fleet, run):
                _write_atomically(claim, f"{fleet}\n{run}\n{where}\n{_mount_namespace()}\n")
        return True

    def uid_holder(self, uid: int) -> UidHolder | None:
        """Who holds ``uid`` here; None when nobody does."""
        try:
            text = _read_private(self.folder / _UIDS / str(uid))
        except FileNotFoundError:
            return None
        fleet, run, where, mounts, *_ = [*text.split("\n"), "", "", ""]
        return UidHolder(fleet, run, where, mounts)

    def release_uid(self, uid: int, fleet: str, run: str) -> None:
        """Let ``uid`` go on this host, if ``run`` of ``fleet`` holds it here."""
        with self._locked():
            holder = self.uid_holder(uid)
            if holder is not None and holder.is_(fleet, run):
                (self.folder / _UIDS / str(uid)).unlink(missing_ok=True)

    def uid_lock(self, uid: int) -> int:
        """A descriptor of ``uid``'s call lock (``uid_leftovers``), for ``flock``."""
        path = self._ensure() / _UID_LOCKS / f"{uid}.lock"
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)

    # -- workers ----------------------------------------------------------------------------

    def worker_id(self, fleet: str) -> str:
        """This process's worker id, its lock taken now and held until the process ends."""
        pid = os.getpid()
        known = _mine.get((str(self.folder), fleet))
        if known is not None and known[0] == pid:
            return known[1]
        workers = self._ensure() / _WORKERS
        worker = secrets.token_hex(WORKER_ID_LENGTH // 2)
        lock = workers / f"{worker}{_WORKER_SUFFIX}"
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, fleet.encode())
        _mine[(str(self.folder), fleet)] = (pid, worker, fd)
        return worker

    @contextlib.contextmanager
    def dead_workers(self, fleet: str) -> Iterator[set[str]]:
        """The ids of ``fleet``'s workers that died, their locks held meanwhile while the caller
        ends what they left. On a clean exit the lock files of the ids still in the set go: the
        caller takes out those whose leftovers it could not end, for a later sweep."""
        held: dict[str, int] = {}
        try:
            with contextlib.suppress(FileNotFoundError), os.scandir(self.folder / _WORKERS) as it:
                for entry in it:
                    worker = entry.name.removesuffix(_WORKER_SUFFIX)
                    if worker == entry.name:
                        continue  # not a worker's lock
                    fd = _dead_lock(Path(entry.path), fleet)
                    if fd is not None:
                        held[worker] = fd
            dead = set(held)
            yield dead
            for worker in dead & held.keys():
                (self.folder / _WORKERS / f"{worker}{_WORKER_SUFFIX}").unlink(missing_ok=True)
        finally:
            for fd in held.values():
                os.close(fd)

    def worker_alive(self, worker: str) -> bool | None:
        """Whether ``worker``'s process lives (its lock is held); None when it has no lock here,
        so that nothing can be said of it."""
        try:
            fd = os.open(self.folder / _WORKERS / f"{worker}{_WORKER_SUFFIX}", os.O_RDONLY)
        except OSError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        finally:
            os.close(fd)
        return False

    # -- the folder -------------------------------------------------------------------------

    def _ensure(self) -> Path:
        """The folder, made if missing, checked to be this user's alone, with its parts: on
        every use, as a worker lives long (a run's claim uses the folder several times)."""
        folder = self.folder
        try:
            try:
                info = os.stat(folder, follow_symlinks=False)
            except FileNotFoundError:
                with contextlib.suppress(FileExistsError):  # made meanwhile
                    folder.mkdir(mode=0o700, parents=True)
                info = os.stat(folder, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                raise HostRegistryError(_unusable(folder, "it is not a folder of this user's own"))
            if info.st_mode & 0o077:
                raise HostRegistryError(_unusable(folder, f"its mode is {info.st_mode & 0o777:o}"))
            # The parts are made in this order: where the last is, so are the others.
            if not os.path.isdir(folder / _UID_LOCKS):
                for part in (_UIDS, _WORKERS, _UID_LOCKS):
                    (folder / part).mkdir(mode=0o700, exist_ok=True)
        except OSError as exc:
            raise HostRegistryError(_unusable(folder, exc.strerror or str(exc))) from exc
        return folder

    def claiming(self) -> contextlib.AbstractContextManager[None]:
        """Held while a process makes (or gives up) its fleet's claim of a uid and this host's,
        as one step: another process on this host never takes a claim on its way out (the
        uid is another fleet's here) for its run's, nor one half written for another run's."""
        return self._locked(_CLAIMING_LOCK)

    @contextlib.contextmanager
    def _locked(self, name: str = _REGISTRY_LOCK) -> Iterator[None]:
        """Every change of a uid claim here is made under this lock, so that a release never
        removes a claim made meanwhile."""
        path = self._ensure() / name
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)


def _dead_lock(path: Path, fleet: str) -> int | None:
    """A descriptor holding the lock at ``path`` if it is ``fleet``'s and free (its worker is
    dead); None otherwise."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.pread(fd, 256, 0).decode(errors="replace") == fleet:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _mount_namespace() -> str:
    try:
        return os.readlink("/proc/self/ns/mnt")
    except OSError:
        return ""


def _write_atomically(path: Path, text: str) -> None:
    draft = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(draft, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        os.write(fd, text.encode())
    finally:
        os.close(fd)
    os.replace(draft, path)


def _read_private(path: Path) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        return os.read(fd, 8192).decode(errors="replace")
    finally:
        os.close(fd)


def _unusable(folder: Path, why: str) -> str:
    return (
        f"the host's sandbox registry {folder} cannot be used: {why}; every sandbox worker on a "
        "host shares it to keep fleets apart, so it must be this worker's user's alone (mode "
        "0700): set TOOLQ_SANDBOX_HOST_STATE to such a folder"
    )
