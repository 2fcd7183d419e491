"""Reading an unpacked image's files from outside it, as the image itself would see them.

An image's symbolic links point into the image (``/bin -> usr/bin``, ``/etc/passwd -> ...``):
they are followed within its root, never out to the worker's own files.
"""

from __future__ import annotations

import contextlib
import os
import stat
from pathlib import Path

#: As the kernel's own bound on links followed while resolving one path.
_MAX_LINKS = 40
#: The most of a passwd or group file read.
_MAX_TABLE_BYTES = 1 << 20


def resolve_in_root(root: Path, path: str) -> Path:
    """``path`` (absolute, as seen inside the image) as a path below ``root``, every link on
    the way followed inside ``root``. The result may not exist."""
    parts = [p for p in path.split("/") if p not in ("", ".")]
    resolved: list[str] = []
    links = 0
    while parts:
        part = parts.pop(0)
        if part == "..":
            if resolved:
                resolved.pop()
            continue
        candidate = root.joinpath(*resolved, part)
        try:
            info = os.lstat(candidate)
        except (FileNotFoundError, NotADirectoryError):
            resolved.append(part)
            continue
        if not stat.S_ISLNK(info.st_mode):
            resolved.append(part)
            continue
        links += 1
        if links > _MAX_LINKS:
            raise OSError(f"too many links resolving {path} in the image")
        target = os.readlink(candidate)
        if target.startswith("/"):
            resolved = []
        parts = [p for p in target.split("/") if p not in ("", ".")] + parts
    return root.joinpath(*resolved)


def has_shell(root: Path) -> bool:
    """The image has an executable ``/bin/sh``: every command of a run goes through it."""
    try:
        info = os.stat(resolve_in_root(root, "/bin/sh"))
    except OSError:
        return False
    return stat.S_ISREG(info.st_mode) and bool(info.st_mode & 0o111)


def lookup_user(root: Path, user: str) -> tuple[int, int]:
    """The (uid, gid) that an image's ``User`` (``""``, ``name``, ``uid``, ``name:group``,
    ``uid:gid``) names, by the image's own /etc/passwd and /etc/group. ``ValueError`` says
    which name the image does not know."""
    name, _, group = user.partition(":")
    if not name:
        uid, gid = 0, 0
    elif name.isdigit():
        uid = int(name)
        entry = _entry(root, "/etc/passwd", 2, name)
        gid = int(entry[3]) if entry is not None and entry[3].isdigit() else 0
    else:
        entry = _entry(root, "/etc/passwd", 0, name)
        if entry is None or not entry[2].isdigit() or not entry[3].isdigit():
            raise ValueError(f"the user {name!r} is not in the image's /etc/passwd")
        uid, gid = int(entry[2]), int(entry[3])
    if group:
        if group.isdigit():
            gid = int(group)
        else:
            found = _entry(root, "/etc/group", 0, group)
            if found is None or not found[2].isdigit():
                raise ValueError(f"the group {group!r} is not in the image's /etc/group")
            gid = int(found[2])
    if not (0 <= uid < 65536 and 0 <= gid < 65536):
        raise ValueError(f"the user {user!r} is outside the ids a container maps (0-65535)")
    return uid, gid


def _entry(root: Path, table: str, column: int, value: str) -> list[str] | None:
    """The first line of ``table`` (in the image) whose ``column`` is ``value``."""
    for line in _read_table(root, table):
        fields = line.split(":")
        if len(fields) > max(column, 3) and fields[column] == value:
            return fields
    return None


def _read_table(root: Path, table: str) -> list[str]:
    path = resolve_in_root(root, table)
    with contextlib.suppress(OSError):
        # The last component too was resolved inside the image: refuse anything but a file.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as file:
            if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
                return []
            return file.read(_MAX_TABLE_BYTES).decode("utf-8", "replace").splitlines()
    return []
