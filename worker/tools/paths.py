"""Path confinement: names resolved below a workspace root and nowhere else, and the words
messages use for paths (printable, shown, counted, what kind of file).

Resolution is by name, component by component below the root, to refuse ``..`` escapes and
symbolic links that lead out with a message the model can act on. The file operations in
``worker.tools.workspace`` then check again, for real, as they open each directory.
"""

from __future__ import annotations

import errno
import os
import stat
from dataclasses import dataclass
from pathlib import Path

from worker.contract.settings import get_worker_settings
from worker.exceptions import PathNotFoundError, WorkspaceError
from worker.quota import WAY_OUT, size_text

#: Longest path accepted, in bytes of UTF-8 (Linux's PATH_MAX).
MAX_PATH_BYTES = 4096
#: Longest single name Linux file systems accept, in bytes.
MAX_NAME_BYTES = 255

_SHOWN_PATH_CHARS = 120
_CONTROL_ESCAPES = {code: f"\\x{code:02x}" for code in [*range(32), 127]} | {
    ord("\n"): "\\n",
    ord("\r"): "\\r",
    ord("\t"): "\\t",
}
# Linux's own limit on symbolic links followed while resolving one path.
_MAX_SYMLINKS = 40


def printable(text: str) -> str:
    """A name as shown to the model: valid UTF-8 on one line.

    Undecodable bytes of file names, lone surrogates and control characters are escaped, so a
    name with a newline cannot pass for two lines of a listing.
    """
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    else:
        text = raw.decode("utf-8", "backslashreplace")
    return text.translate(_CONTROL_ESCAPES)


def shown(path: str) -> str:
    """A path as quoted in a message: printable and never absurdly long."""
    text = printable(path)
    if len(text) > _SHOWN_PATH_CHARS:
        half = _SHOWN_PATH_CHARS // 2
        text = f"{text[:half]}…{text[-half:]} ({len(path)} characters)"
    return repr(text)


def counted(number: int, singular: str, plural: str | None = None) -> str:
    """``1 entry``, ``2 entries``: a number and its noun, thousands separated."""
    noun = singular if number == 1 else (plural or singular + "s")
    return f"{number:,} {noun}"


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    kinds = (
        (stat.S_ISREG, "a file"),
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISLNK, "a symbolic link"),
        (stat.S_ISFIFO, "a named pipe (FIFO)"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((words for test, words in kinds if test(mode)), "not a regular file")


@dataclass(frozen=True, slots=True)
class _Location:
    """Where a workspace is: its root, symbolic links resolved (also as text, compared often),
    and who must own what tools create there."""

    root: Path
    text: str
    owner: tuple[int, int] | None


def _no_space() -> str:
    """Why a write found no space: with a file system of the quota's size for each workspace
    (``TOOLQ_WORKSPACE_QUOTA_FS=loop``) it is the quota, which the model can do something about."""
    try:
        settings = get_worker_settings()
    except ValueError:  # settings a worker refused at its start; not this call's business
        return "no space left on the device"
    if settings.workspace_quota_fs != "loop" or not settings.workspace_quota_bytes:
        return "no space left on the device"
    quota = settings.workspace_quota_bytes
    shown_quota = size_text(quota).partition(" (")[0]  # "64.0 KiB": the variable has the bytes
    return (
        f"the workspace is full at its quota of {shown_quota} (TOOLQ_WORKSPACE_QUOTA_BYTES="
        f"{quota}); {WAY_OUT}"
    )


class ConfinedPaths:
    """Names resolved below one root directory, and messages about them.

    The root is kept as a location, so that a view of whichever workspace is current (see
    ``worker.tools.runtime.CurrentWorkspace``) can stand in for a fixed one.
    """

    def __init__(self, root: Path | str, owner: tuple[int, int] | None = None) -> None:
        self._ensure_root(Path(root).absolute(), owner)
        real = Path(os.path.realpath(root))
        self._where: _Location | None = _Location(real, str(real), owner)

    @property
    def _location(self) -> _Location:
        assert self._where is not None
        return self._where

    @property
    def root(self) -> Path:
        """The workspace directory, symbolic links resolved."""
        return self._location.root

    @property
    def owner(self) -> tuple[int, int] | None:
        return self._location.owner

    @property
    def _root(self) -> str:
        return self._location.text

    # -- resolving names ----------------------------------------------------------------------

    def resolve(self, path: str) -> Path:
        """The absolute path ``path`` leads to, symlinks followed; it must be in the workspace."""
        return self._resolve(path, follow_last=True)

    def entry(self, path: str) -> Path:
        """The absolute path of the entry ``path`` names, a final symlink itself not followed.

        This is what remove and move act on: removing a link removes the link, not its target.
        """
        return self._resolve(path, follow_last=False)

    def relative(self, path: Path) -> str:
        """``path`` as the model sees it: relative to the workspace, ``.`` for the root."""
        text = str(path)
        if text == self._root:
            return "."
        if text.startswith(self._root + os.sep):
            return printable(text[len(self._root) + 1 :])
        raise WorkspaceError(f"{shown(text)} is outside the workspace")

    def is_root(self, path: Path) -> bool:
        return str(path) == self._root

    # -- messages -----------------------------------------------------------------------------

    def error(self, exc: OSError, where: str) -> WorkspaceError:
        """An OS error as a message about the workspace path ``where``."""
        code = exc.errno
        if code == errno.ENOENT:
            return PathNotFoundError(f"{shown(where)} does not exist")
        reasons = {
            errno.ENOTDIR: "a part of the path is a file, not a directory",
            errno.EISDIR: "it is a directory",
            errno.ELOOP: "it is a symbolic link that cannot be followed here (a loop, or it "
            "changed while in use)",
            errno.ENAMETOOLONG: f"a name in it is too long (at most {MAX_NAME_BYTES} bytes per "
            f"name and {MAX_PATH_BYTES} bytes in all)",
            errno.EACCES: "permission denied",
            errno.EPERM: "operation not permitted",
            errno.EEXIST: "something already exists there",
            errno.ENOTEMPTY: "the directory is not empty",
            errno.ENOSPC: _no_space(),
            errno.EDQUOT: "the disk quota is exceeded",
            errno.EROFS: "the file system is read-only",
            errno.EFBIG: "the file would be too large",
            errno.ENXIO: "no such device",
        }
        reason = reasons.get(code or 0, exc.strerror or type(exc).__name__)
        return WorkspaceError(f"{shown(where)}: {reason}")

    # -- internals ----------------------------------------------------------------------------

    @staticmethod
    def _ensure_root(root: Path, owner: tuple[int, int] | None) -> None:
        if root.is_dir():
            return
        root.parent.mkdir(parents=True, exist_ok=True)
        try:
            root.mkdir()
        except FileExistsError:
            if root.is_dir():
                return  # made meanwhile by another worker
            raise WorkspaceError(
                f"the workspace {str(root)!r} exists but is not a directory"
            ) from None
        if owner is not None:
            os.chown(root, *owner, follow_symlinks=False)

    def _resolve(self, path: str, *, follow_last: bool) -> Path:
        """Resolve ``path`` like the kernel would, but only below the root.

        Components are looked at one by one (``lstat``), symlinks replaced by their targets, so
        the moment a ``..`` or a link would leave the root is known and named in the message.
        Past the first missing component the rest is taken by name.
        """
        pending = _components(self._below_root(path))
        pending.reverse()
        done: list[str] = []
        links = 0
        missing = False
        while pending:
            part = pending.pop()
            if part == "..":
                if not done:
                    raise WorkspaceError(self._escape_message(path, via_link=links > 0))
                done.pop()
                continue
            if missing or (not pending and not follow_last):
                done.append(part)
                continue
            current = os.path.join(self._root, *done, part)
            try:
                info = os.lstat(current)
            except OSError:
                missing = True  # absent (or unusable): the operation itself will say which
                done.append(part)
                continue
            if not stat.S_ISLNK(info.st_mode):
                done.append(part)
                continue
            links += 1
            if links > _MAX_SYMLINKS:
                raise WorkspaceError(f"{shown(path)}: too many levels of symbolic links (a loop?)")
            try:
                target = os.readlink(current)
            except OSError:
                missing = True  # replaced meanwhile: the operation itself will refuse a link
                done.append(part)
                continue
            if os.path.isabs(target):
                if target != self._root and not target.startswith(self._root + os.sep):
                    raise WorkspaceError(self._escape_message(path, via_link=True))
                done = []
                target = target[len(self._root) + 1 :]
            pending.extend(reversed(_components(target)))
        return self.root.joinpath(*done)

    def _below_root(self, path: str) -> str:
        """``path`` checked and made relative to the root."""
        if not isinstance(path, str):
            raise WorkspaceError(f"a path must be a string, not {type(path).__name__}")
        if "\x00" in path:
            raise WorkspaceError(f"{shown(path)} contains a NUL byte, which no file name can hold")
        try:
            size = len(os.fsencode(path))
        except UnicodeEncodeError:
            raise WorkspaceError(
                f"{shown(path)} contains characters that cannot be part of a file name"
            ) from None
        if size > MAX_PATH_BYTES:
            raise WorkspaceError(
                f"the path is too long ({size} bytes; at most {MAX_PATH_BYTES}): {shown(path)}"
            )
        if not os.path.isabs(path):
            return path
        if path.rstrip(os.sep) == self._root:
            return ""
        if path.startswith(self._root + os.sep):
            return path[len(self._root) + 1 :]
        raise WorkspaceError(
            f"{shown(path)} is an absolute path outside the workspace; only files in the "
            "workspace can be used. Give a path relative to the workspace, such as "
            "'notes/todo.txt'."
        )

    def _inside(self, real: str) -> bool:
        return real == self._root or real.startswith(self._root + os.sep)

    def _escape_message(self, path: str, *, via_link: bool) -> str:
        how = "through a symbolic link" if via_link else "through '..'"
        return (
            f"{shown(path)} leads outside the workspace {how}; only files in the workspace can "
            "be used. Give a path relative to the workspace, such as 'notes/todo.txt'."
        )


def _components(path: str) -> list[str]:
    return [part for part in path.split(os.sep) if part not in ("", ".")]
