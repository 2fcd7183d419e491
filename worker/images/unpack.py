"""One image layer unpacked into a folder of its own, in the form overlayfs reads as a lower
layer: a whiteout (``.wh.name``) becomes a character device 0/0 named ``name``, an opaque folder
(``.wh..wh..opq``) the ``trusted.overlay.opaque`` attribute on its folder.

The layer is shared by every image that has it, so it is taken as an attacker may have written
it: its decompressed stream must hash to the diff id the image's configuration gives (another
image's layer cannot be passed off under a known id), and an entry that would climb out of the
folder (``..``), go through a link, whiteout what is not a name, link to a file its own layer
does not hold, or make a device node is refused, naming the entry. Links are made as links and
never followed; the entries' owners and modes are kept as the image gives them (an idmapped
mount maps them per container); of extended attributes only ``user.*`` and
``security.capability`` are kept (``trusted.overlay.*`` would steer overlayfs).
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import stat
import tarfile
import time
import zlib
from pathlib import Path

from worker.contract.errors import ImageError
from worker.exceptions import BadEntry
from worker.images.layers import decompressed

_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"
_OPAQUE_XATTR = "trusted.overlay.opaque"
_KEPT_XATTRS = ("user.",)
_CAPABILITY = "security.capability"
_PAX_XATTR = "SCHILY.xattr."
_CHUNK = 1 << 20


class _Hashing(io.RawIOBase):
    """``stream``, read through, every byte hashed."""

    def __init__(self, stream: io.BufferedIOBase) -> None:
        self.stream = stream
        self.digest = hashlib.sha256()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        data = self.stream.read(len(buffer))
        self.digest.update(data)
        buffer[: len(data)] = data
        return len(data)

    def drain(self) -> None:
        while self.read(_CHUNK):
            pass


def unpack_layer(
    image: str,
    number: int,
    media_type: str,
    blob: Path,
    diff_id: str,
    target: Path,
    deadline: float,
) -> None:
    """The layer ``blob`` (the image's ``number``-th, bottom first) into the empty folder
    ``target``; ``ImageError`` (one line) when it is not what ``diff_id`` says or holds an
    entry that cannot be unpacked safely."""
    try:
        with decompressed(image, media_type, blob) as stream:
            hashing = _Hashing(stream)
            _extract(io.BufferedReader(hashing, _CHUNK), target, deadline)
            hashing.drain()
    except BadEntry as bad:
        raise ImageError(image, f"its layer {number} is refused: {bad}") from None
    except TimeoutError:
        raise ImageError(image, f"no time was left to unpack its layer {number}") from None
    except (tarfile.TarError, OSError, EOFError, zlib.error, ValueError) as exc:
        raise ImageError(image, f"its layer {number} could not be unpacked: {exc}") from None
    found = f"sha256:{hashing.digest.hexdigest()}"
    if found != diff_id:
        raise ImageError(
            image,
            f"its layer {number} is not what its configuration says: its content is {found}, "
            f"not {diff_id}",
        )


def _extract(stream: io.BufferedReader, target: Path, deadline: float) -> None:
    folders: list[tuple[Path, int]] = []
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        while (member := archive.next()) is not None:
            vars(archive)["members"].clear()  # stream mode would keep every header
            if time.monotonic() > deadline:
                raise TimeoutError
            parts = entry_parts(member.name)
            if not parts:
                continue  # the layer's root: the container's root folder is the run's layer
            parent = _parent(target, parts, member.name)
            name = parts[-1]
            if name == _OPAQUE:
                os.setxattr(parent, _OPAQUE_XATTR, b"y")
            elif name.startswith(_WHITEOUT + _WHITEOUT):
                continue  # other AUFS bookkeeping (hard link folders): nothing in the image
            elif name.startswith(_WHITEOUT):
                hidden = name[len(_WHITEOUT) :]
                if hidden in ("", ".", ".."):
                    raise BadEntry(f"{member.name!r} whites out no name")
                _clear(parent / hidden, keep_folder=False)
                os.mknod(parent / hidden, stat.S_IFCHR | 0o600, os.makedev(0, 0))
            else:
                path = parent / name
                _clear(path, keep_folder=member.isdir())
                _make(archive, member, path, target)
                if member.isdir():
                    folders.append((path, int(member.mtime)))
    # Folders last: making their entries changed their times.
    for path, mtime in reversed(folders):
        os.utime(path, (mtime, mtime), follow_symlinks=False)


def entry_parts(name: str) -> list[str]:
    """The path components of a tar entry's name, inside the layer; ``BadEntry`` for one that
    climbs out of it."""
    parts = [p for p in name.split("/") if p not in ("", ".")]
    if ".." in parts:
        raise BadEntry(f"{name!r} climbs out of the layer")
    if any("\0" in p for p in parts):
        raise BadEntry(f"{name!r} has a NUL in its name")
    return parts


def _parent(target: Path, parts: list[str], name: str) -> Path:
    """The folder of the entry, its missing folders made; ``BadEntry`` where the way goes
    through anything but a folder of the layer (a link could lead out of it)."""
    folder = target
    for part in parts[:-1]:
        folder = folder / part
        try:
            info = os.lstat(folder)
        except FileNotFoundError:
            os.mkdir(folder, 0o755)
            continue
        if not stat.S_ISDIR(info.st_mode):
            raise BadEntry(f"{name!r} goes through {part!r}, which is not a folder (a link?)")
    return folder


def _held(target: Path, member: tarfile.TarInfo) -> Path:
    """The file of this layer a hard link names, reached through folders only."""
    path = target
    for part in entry_parts(member.linkname):
        try:
            info = os.lstat(path)
        except FileNotFoundError:
            info = None
        if info is None or not stat.S_ISDIR(info.st_mode):
            break
        path = path / part
    else:
        if os.path.lexists(path):
            return path
    raise BadEntry(f"{member.name!r} links to {member.linkname!r}, which its layer does not hold")


def _clear(path: Path, *, keep_folder: bool) -> None:
    """Make way for a later entry of the same name (the last one in the layer wins)."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(info.st_mode):
        if not keep_folder:
            shutil.rmtree(path)
    else:
        os.unlink(path)


def _make(archive: tarfile.TarFile, member: tarfile.TarInfo, path: Path, target: Path) -> None:
    if member.isreg():
        source = archive.extractfile(member)
        assert source is not None
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as out:
            shutil.copyfileobj(source, out, _CHUNK)
    elif member.isdir():
        if not os.path.isdir(path):
            os.mkdir(path, 0o700)
    elif member.issym():
        os.symlink(member.linkname, path)
    elif member.islnk():
        source_path = _held(target, member)
        source_info = os.lstat(source_path)
        if stat.S_ISDIR(source_info.st_mode):
            raise BadEntry(f"{member.name!r} is a hard link to a folder")
        os.link(source_path, path, follow_symlinks=False)
        return  # the link shares its file's owner and mode
    elif member.isfifo():
        os.mkfifo(path, 0o600)
    else:
        raise BadEntry(f"{member.name!r} is a device node or another special file")
    _own(member, path)


def _own(member: tarfile.TarInfo, path: Path) -> None:
    os.lchown(path, member.uid, member.gid)
    for key, value in member.pax_headers.items():
        if key.startswith(_PAX_XATTR):
            attribute = key[len(_PAX_XATTR) :]
            if attribute == _CAPABILITY or attribute.startswith(_KEPT_XATTRS):
                os.setxattr(
                    path, attribute, value.encode("utf-8", "surrogateescape"), follow_symlinks=False
                )
    if not member.issym():
        # After the owner: chown clears setuid bits.
        os.chmod(path, member.mode & 0o7777)
        if not member.isdir():
            os.utime(path, (member.mtime, member.mtime))
    else:
        os.utime(path, (member.mtime, member.mtime), follow_symlinks=False)
