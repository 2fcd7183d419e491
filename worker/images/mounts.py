"""A container's root file system: the cached image's layers, read-only, beneath a writable
layer of the run's own (overlayfs), each layer seen through an idmapped mount.

The layers are unpacked once with the owners the image gives them (root's are uid 0), and shared
by every image and run that has them. Each container sees them through idmapped, read-only
clones (Linux 5.12 and later; overlayfs takes them as lower layers since 5.19) whose mapping is
the container's: the image's user is the run's own uid, so the run's processes own what the
image gave its user, copy it up into their own layer when they write it, and own the workspace
files the tools wrote for them, with no copy and no chown of the image. The clones are never
attached anywhere (overlayfs is given them by descriptor and holds them): the container's root
is its one mount, and unmounting it leaves nothing of it mounted.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from pathlib import Path

from worker.exceptions import MountError
from worker.images.spec import IdMap
from worker.sandbox.bounded import wait_at_most

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_text = ctypes.c_char_p
_libc.mount.argtypes = [_text, _text, _text, ctypes.c_ulong, _text]
_libc.umount2.argtypes = [ctypes.c_char_p, ctypes.c_int]

# The new mount API's system calls share one number on every architecture.
#: How long the holder of a user namespace may take to exit once its input closed.
_HOLDER_END_S = 5.0
_SYS_OPEN_TREE = 428
_SYS_MOUNT_SETATTR = 442
_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_AT_RECURSIVE = 0x8000
_OPEN_TREE_CLONE = 1
_OPEN_TREE_CLOEXEC = os.O_CLOEXEC
_MOUNT_ATTR_RDONLY = 0x00000001
_MOUNT_ATTR_IDMAP = 0x00100000
_MNT_DETACH = 2


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def mount_rootfs(
    layer_roots: Sequence[Path], bundle: Path, uids: Sequence[IdMap], gids: Sequence[IdMap]
) -> Path:
    """``bundle/rootfs``: ``layer_roots`` (bottom first) seen with the container's id mappings,
    read-only, beneath the writable ``bundle/upper``. Undone by ``remove_bundle``."""
    upper, work, rootfs = (bundle / n for n in ("upper", "work", "rootfs"))
    for folder in (upper, work, rootfs):
        folder.mkdir(mode=0o700, exist_ok=True)
    # The layer's top is the root folder the container sees: its user's, like the image's.
    owner = host_id(uids, 0)
    group = host_id(gids, 0)
    os.chown(upper, owner, group)
    # The box's root and its mount point: readable by all, as any root folder.
    os.chmod(upper, 0o755)  # noqa: S103
    os.chmod(rootfs, 0o755)  # noqa: S103
    clones: list[int] = []
    try:
        userns = _user_namespace(uids, gids)
        try:
            for root in reversed(layer_roots):
                clones.append(_idmapped_clone(root, userns))
        finally:
            os.close(userns)
        options = f"lowerdir={_by_descriptor(clones)},upperdir={upper},workdir={work}"
        _mount("overlay", rootfs, "overlay", options)
    finally:
        for fd in clones:
            os.close(fd)
    return rootfs


@contextlib.contextmanager
def image_view(layer_roots: Sequence[Path], at: Path) -> Iterator[Path]:
    """``layer_roots`` (bottom first) merged, read-only, at ``at`` while the block runs: the
    image's files as the image sees them (its users, its shell), read from outside it."""
    at.mkdir(mode=0o700, exist_ok=True)
    # Without an upper layer overlayfs wants two lower ones: an empty one at the bottom.
    empty = at.with_name(f"{at.name}.empty")
    empty.mkdir(mode=0o700, exist_ok=True)
    fds = [
        os.open(root, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC) for root in [empty, *layer_roots]
    ]
    try:
        _mount("overlay", at, "overlay", f"ro,lowerdir={_by_descriptor(fds[::-1])}")
    finally:
        for fd in fds:
            os.close(fd)
    try:
        yield at
    finally:
        _libc.umount2(os.fsencode(at), _MNT_DETACH)


def remove_bundle(bundle: Path) -> None:
    """Undo ``mount_rootfs`` and ``image_view`` (what of them was made) and delete a
    container's folder; its layer goes with it. ``lower`` is where a worker of before shared
    layers had its image."""
    for name in ("rootfs", "view", "lower"):
        # A mount made twice (a retried start) is undone as often as it was made.
        for _ in range(4):
            if _libc.umount2(os.fsencode(bundle / name), _MNT_DETACH) != 0:
                break
    if not any(is_mount(bundle / name) for name in ("rootfs", "view", "lower")):
        shutil.rmtree(bundle, ignore_errors=True)


def unmount_below(folder: Path) -> None:
    """Whatever is mounted at or below ``folder`` (an image view a killed pull left)."""
    prefix = os.fsdecode(os.path.abspath(folder))
    with contextlib.suppress(OSError), open("/proc/self/mountinfo", "rb") as info:
        points = [_unescape(line.split()[4].decode("utf-8", "surrogateescape")) for line in info]
        for point in sorted(points, reverse=True):
            if point == prefix or point.startswith(prefix + "/"):
                _libc.umount2(os.fsencode(point), _MNT_DETACH)


def _unescape(point: str) -> str:
    """A mount point as mountinfo writes it (space, tab, newline, backslash in octal)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), point)


def _by_descriptor(fds: Sequence[int]) -> str:
    """Layers for overlayfs's options by their descriptors: short, whatever their paths, so
    that an image of many layers stays within the options' one page."""
    return ":".join(f"/proc/self/fd/{fd}" for fd in fds)


def is_mount(path: Path) -> bool:
    with contextlib.suppress(OSError):
        return os.path.ismount(path)
    return False


def host_id(maps: Sequence[IdMap], container_id: int) -> int:
    """The host id that ``container_id`` maps to; the overflow id (65534) when none does."""
    for entry in maps:
        if entry.container_id <= container_id < entry.container_id + entry.size:
            return entry.host_id + container_id - entry.container_id
    return 65534


def _user_namespace(uids: Sequence[IdMap], gids: Sequence[IdMap]) -> int:
    """A descriptor of a new user namespace with these mappings: what an idmapped mount takes."""
    unshare = shutil.which("unshare") or "unshare"
    holder = subprocess.Popen(
        [unshare, "--user", "--", "/bin/sh", "-c", "echo; read _"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert holder.stdin is not None and holder.stdout is not None
    try:
        if not holder.stdout.readline():
            raise MountError("unshare --user could not make a user namespace")
        base = Path(f"/proc/{holder.pid}")
        (base / "uid_map").write_text("".join(m.line() for m in uids))
        (base / "setgroups").write_text("deny")
        (base / "gid_map").write_text("".join(m.line() for m in gids))
        return os.open(base / "ns" / "user", os.O_RDONLY | os.O_CLOEXEC)
    finally:
        holder.stdin.close()
        holder.stdout.close()
        # It exits at the end of its input; killed if it has not.
        if (
            wait_at_most(holder, _HOLDER_END_S, "the user namespace holder of an idmapped mount")
            is None
        ):
            holder.kill()
            wait_at_most(holder, _HOLDER_END_S, "the killed user namespace holder")


def _idmapped_clone(source: Path, userns: int) -> int:
    """A detached, read-only clone of ``source`` with ``userns``'s mapping: its descriptor."""
    fd = _check(
        _libc.syscall(
            _SYS_OPEN_TREE,
            _AT_FDCWD,
            os.fsencode(source),
            _OPEN_TREE_CLONE | _OPEN_TREE_CLOEXEC | _AT_RECURSIVE,
        ),
        f"open_tree of {source}",
    )
    try:
        attr = _MountAttr(_MOUNT_ATTR_IDMAP | _MOUNT_ATTR_RDONLY, 0, 0, userns)
        _check(
            _libc.syscall(
                _SYS_MOUNT_SETATTR, fd, b"", _AT_EMPTY_PATH, ctypes.byref(attr), ctypes.sizeof(attr)
            ),
            "an idmapped mount (Linux 5.12 or later, on a file system that allows it)",
        )
    except BaseException:
        os.close(fd)
        raise
    return fd


def _mount(source: str, target: Path, fstype: str, options: str) -> None:
    result = _libc.mount(source.encode(), os.fsencode(target), fstype.encode(), 0, options.encode())
    _check(result, f"the {fstype} mount of the image's layers at {target.name}")


def _check(result: int, what: str) -> int:
    if result < 0:
        errno = ctypes.get_errno()
        raise MountError(errno, f"{what} failed: {os.strerror(errno)}")
    return result
