"""The run's workspace: file operations that stay inside one directory.

Paths are resolved twice. First by name (``worker.tools.paths``), to refuse escapes with a
message the model can act on. Then for real: every operation starts from a descriptor of the
root and opens one directory at a time with ``O_NOFOLLOW``, so a symlink swapped in after the
first check is refused rather than followed, and the directory finally used is checked once
more through ``/proc/self/fd``.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NoReturn

from worker.exceptions import PathNotFoundError, WorkspaceError
from worker.tools.paths import ConfinedPaths, file_kind, shown
from worker.tools.tree_walk import DIRECTORY_FLAGS, Walked, listing, scan_directory, walk_below

__all__ = ["DirectoryEntry", "PathNotFoundError", "Workspace", "WorkspaceError"]

# O_NONBLOCK: opening a FIFO must never wait for a writer.
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_NEW_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True, slots=True)
class DirectoryEntry:
    """One name in a directory, as found (symbolic links not followed)."""

    name: str
    stat: os.stat_result
    link_target: str | None = None


class Workspace(ConfinedPaths):
    """One directory that file tools may use, and the only place they may use.

    ``owner`` is the (uid, gid) that must own whatever tools create, so that an unprivileged
    sandbox user can still read and write the workspace when the worker runs as root.
    """

    # -- opening, safely ----------------------------------------------------------------------

    @contextmanager
    def directory(self, path: Path, *, create: bool = False) -> Iterator[int]:
        """A descriptor of the directory ``path`` (made, with its parents, if ``create``)."""
        fd, _ = self._open_directory(path, create=create)
        try:
            yield fd
        finally:
            os.close(fd)

    @contextmanager
    def parent(self, path: Path, *, create: bool = False) -> Iterator[tuple[int, str]]:
        """A descriptor of the directory holding ``path``, and the name inside it."""
        if self.is_root(path):
            raise WorkspaceError("'.' is the workspace root itself; name something inside it")
        with self.directory(path.parent, create=create) as fd:
            yield fd, path.name

    @contextmanager
    def open_for_reading(self, path: Path) -> Iterator[tuple[BinaryIO, os.stat_result]]:
        """The regular file at ``path``, opened to read, and its status."""
        if self.is_root(path):
            raise WorkspaceError("'.' is a directory (the workspace root); use list_dir on it")
        with self.parent(path) as (dir_fd, name):
            fd = self.open_regular_at(dir_fd, name, self.relative(path))
        with os.fdopen(fd, "rb") as file:
            yield file, os.fstat(fd)

    def open_regular_at(self, dir_fd: int, name: str, where: str) -> int:
        """Open ``name`` in ``dir_fd`` to read; refuse links, directories, pipes and devices."""
        try:
            fd = os.open(name, _READ_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            found = self._lstat_at(dir_fd, name, where) if exc.errno == errno.ENXIO else None
            if found is None:  # ENXIO is also how opening a socket fails: say what it is
                raise self.error(exc, where) from None
            self._refuse_unreadable(found, where)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            os.close(fd)
            self._refuse_unreadable(info, where)
        if info.st_nlink > 1 and info.st_uid != self._owner_uid:
            # A hard link names the same file as another path, which may be anywhere on the
            # file system: one the run does not own may be another run's, or the host's.
            os.close(fd)
            raise WorkspaceError(
                f"{shown(where)} is a hard link to a file the run does not own; it is not read"
            )
        return fd

    @property
    def _owner_uid(self) -> int:
        """The uid the run's own files have: the workspace's owner, else this process's."""
        return self.owner[0] if self.owner is not None else os.geteuid()

    def _refuse_unreadable(self, info: os.stat_result, where: str) -> NoReturn:
        if stat.S_ISDIR(info.st_mode):
            raise WorkspaceError(f"{shown(where)} is a directory; use list_dir to see inside")
        raise WorkspaceError(
            f"{shown(where)} is {file_kind(info.st_mode)}, not a regular file; "
            "only regular files can be read"
        )

    # -- changing things ----------------------------------------------------------------------

    def write_file(self, path: Path, data: bytes) -> None:
        """Replace (or create) the regular file at ``path`` with ``data``, all or nothing."""
        where = self.relative(path)
        with self.parent(path, create=True) as (dir_fd, name):
            existing = self._lstat_at(dir_fd, name, where)
            if existing is not None and not stat.S_ISREG(existing.st_mode):
                raise WorkspaceError(
                    f"{shown(where)} is {file_kind(existing.st_mode)}; write_file only writes "
                    "regular files"
                )
            if existing is None and self._create_new(dir_fd, name, data, where):
                return
            # Replace through a temporary file and a rename: never half a file, never a link
            # followed, and the old content stays whole until the new one is complete.
            temporary = f".toolq-{secrets.token_hex(8)}.tmp"
            try:
                fd = os.open(temporary, _NEW_FILE_FLAGS, 0o644, dir_fd=dir_fd)
                try:
                    self._adopt(fd, existing)
                    if existing is not None:
                        os.fchmod(fd, stat.S_IMODE(existing.st_mode))
                    _write_all(fd, data)
                finally:
                    os.close(fd)
                os.rename(temporary, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            except OSError as exc:
                with suppress(OSError):
                    os.unlink(temporary, dir_fd=dir_fd)
                raise self.error(exc, where) from None

    def _create_new(self, dir_fd: int, name: str, data: bytes, where: str) -> bool:
        """Write a file that does not exist yet; False if one appeared meanwhile."""
        try:
            fd = os.open(name, _NEW_FILE_FLAGS, 0o644, dir_fd=dir_fd)
        except FileExistsError:
            return False
        except OSError as exc:
            raise self.error(exc, where) from None
        try:
            self._adopt(fd, None)
            _write_all(fd, data)
        except OSError as exc:
            with suppress(OSError):
                os.unlink(name, dir_fd=dir_fd)
            raise self.error(exc, where) from None
        finally:
            os.close(fd)
        return True

    def make_directories(self, path: Path) -> bool:
        """``mkdir -p path``; whether anything had to be made."""
        fd, created = self._open_directory(path, create=True)
        os.close(fd)
        return created

    def remove(self, path: Path) -> os.stat_result | None:
        """Remove the entry at ``path``, recursively; what was there, or None if nothing was."""
        if self.is_root(path):
            raise WorkspaceError("refusing to remove the workspace root itself")
        where = self.relative(path)
        try:
            with self.parent(path) as (dir_fd, name):
                found = self._lstat_at(dir_fd, name, where)
                if found is None:
                    return None
                try:
                    if stat.S_ISDIR(found.st_mode):
                        shutil.rmtree(name, dir_fd=dir_fd)
                    else:
                        os.unlink(name, dir_fd=dir_fd)
                except FileNotFoundError:
                    return None
                except OSError as exc:
                    raise self.error(exc, where) from None
                return found
        except PathNotFoundError:
            return None

    def lstat(self, path: Path) -> os.stat_result | None:
        """The status of the entry at ``path`` itself (links not followed), None if absent."""
        if self.is_root(path):
            with self.directory(path) as fd:
                return os.fstat(fd)
        try:
            with self.parent(path) as (dir_fd, name):
                return self._lstat_at(dir_fd, name, self.relative(path))
        except PathNotFoundError:
            return None

    def rename(self, source: Path, destination: Path) -> None:
        """Move the entry ``source`` to ``destination``, making the destination's parents."""
        where = self.relative(source)
        with self.parent(source) as (source_fd, source_name):
            if self._lstat_at(source_fd, source_name, where) is None:
                raise PathNotFoundError(f"{shown(where)} does not exist")
            with self.parent(destination, create=True) as (target_fd, target_name):
                try:
                    os.rename(source_name, target_name, src_dir_fd=source_fd, dst_dir_fd=target_fd)
                except OSError as exc:
                    raise self._rename_error(exc, where, self.relative(destination)) from None

    # -- looking around -----------------------------------------------------------------------

    def scan(self, path: Path) -> list[DirectoryEntry]:
        """The entries of the directory ``path``, sorted by name."""
        with self.directory(path) as fd:
            found: list[DirectoryEntry] = []
            for item in scan_directory(fd):
                try:
                    info = item.stat(follow_symlinks=False)
                    target = os.readlink(item.name, dir_fd=fd) if item.is_symlink() else None
                except OSError:
                    continue  # removed while we looked
                found.append(DirectoryEntry(item.name, info, target))
        return sorted(found, key=lambda e: e.name)

    def walk(self, path: Path) -> Iterator[Walked]:
        """Walk the tree at ``path`` top-down without following symlinks.

        Yields (directory relative to ``path``, "" for ``path`` itself; its descriptor; sorted
        subdirectory names, which the caller may prune in place; sorted other names).
        """
        top, _ = self._open_directory(path, create=False)
        try:
            dirs, files = listing(top)
        except OSError as exc:
            os.close(top)
            raise self.error(exc, self.relative(path)) from None
        yield from walk_below(top, dirs, files)

    # -- internals ----------------------------------------------------------------------------

    def _open_root(self) -> int:
        try:
            fd = os.open(self._root, DIRECTORY_FLAGS)
        except FileNotFoundError:
            self._ensure_root(self.root, self.owner)
            fd = os.open(self._root, DIRECTORY_FLAGS)
        return fd

    def _open_directory(self, path: Path, *, create: bool) -> tuple[int, bool]:
        """Open ``path`` one component at a time from the root, never following a symlink."""
        where = self.relative(path)
        parts = [] if where == "." else str(path)[len(self._root) + 1 :].split(os.sep)
        created = False
        fd = self._open_root()
        try:
            for depth, part in enumerate(parts):
                step = os.sep.join(parts[: depth + 1])
                child, made = self._step(fd, part, step, create=create)
                os.close(fd)
                fd = child
                created = created or made
            self._verify_inside(fd, where)
        except BaseException:
            os.close(fd)
            raise
        return fd, created

    def _step(self, dir_fd: int, name: str, where: str, *, create: bool) -> tuple[int, bool]:
        made = False
        try:
            return os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd), made
        except FileNotFoundError:
            if not create:
                raise PathNotFoundError(f"{shown(where)} does not exist") from None
        except OSError as exc:
            raise self._not_a_directory(exc, dir_fd, name, where) from None
        try:
            os.mkdir(name, 0o777, dir_fd=dir_fd)
            made = True
        except FileExistsError:
            pass  # made meanwhile by someone else: use it
        except OSError as exc:
            raise self.error(exc, where) from None
        try:
            fd = os.open(name, DIRECTORY_FLAGS, dir_fd=dir_fd)
        except OSError as exc:
            raise self._not_a_directory(exc, dir_fd, name, where) from None
        if made:
            self._adopt(fd, None)
        return fd, made

    def _not_a_directory(self, exc: OSError, dir_fd: int, name: str, where: str) -> WorkspaceError:
        if exc.errno not in (errno.ENOTDIR, errno.ELOOP):
            return self.error(exc, where)
        try:
            info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except OSError:
            return self.error(exc, where)
        if stat.S_ISLNK(info.st_mode):
            return WorkspaceError(
                f"{shown(where)} is a symbolic link that cannot be followed here (it changed "
                "while in use, or it loops); nothing was done"
            )
        return WorkspaceError(f"{shown(where)} is {file_kind(info.st_mode)}, not a directory")

    def _verify_inside(self, fd: int, where: str) -> None:
        try:
            actual = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return  # no /proc: the O_NOFOLLOW walk from the root already kept us inside
        if not self._inside(actual):
            raise WorkspaceError(
                f"{shown(where)} is no longer inside the workspace (it was moved while in use); "
                "nothing was done"
            )

    def _lstat_at(self, dir_fd: int, name: str, where: str) -> os.stat_result | None:
        try:
            return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise self.error(exc, where) from None

    def _adopt(self, fd: int, replacing: os.stat_result | None) -> None:
        """Give a new file or directory its owner: the workspace's, else the one it replaces."""
        if self.owner is not None:
            os.fchown(fd, *self.owner)
        elif replacing is not None:
            with suppress(PermissionError):
                os.fchown(fd, replacing.st_uid, replacing.st_gid)

    def _rename_error(self, exc: OSError, source: str, destination: str) -> WorkspaceError:
        reasons = {
            errno.EINVAL: "a directory cannot be moved into itself",
            errno.ENOTEMPTY: f"{shown(destination)} is a directory that is not empty",
            errno.EEXIST: f"{shown(destination)} is a directory that is not empty",
            errno.EISDIR: f"{shown(destination)} is a directory and {shown(source)} is not",
            errno.ENOTDIR: f"{shown(source)} is a directory and {shown(destination)} is not",
            errno.EXDEV: "the two paths are on different file systems",
            errno.EBUSY: "the path is in use",
        }
        reason = reasons.get(exc.errno or 0)
        if reason is None:
            return self.error(exc, f"{source} -> {destination}")
        return WorkspaceError(f"cannot move {shown(source)} to {shown(destination)}: {reason}")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]
