"""What an image has at its WorkingDir, brought into the run's workspace that is mounted there,
as Docker fills a new volume: the repository of a SWE-bench image, for instance, is then in the
workspace, where the file tools and the run's commands both see it."""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path


def seed_workspace(source: Path, workspace: Path, owner: tuple[int, int]) -> int:
    """Copy what ``source`` (a folder of an unpacked image, links resolved inside it) holds
    into ``workspace``, never over what is there already, every copy ``owner``'s; links are
    copied as links, never followed. How many entries were copied."""
    try:
        if not stat.S_ISDIR(os.lstat(source).st_mode):
            return 0
    except OSError:
        return 0
    copied = 0
    for folder, dirs, files in os.walk(source):
        relative = Path(folder).relative_to(source)
        target_folder = workspace / relative
        for name in [*dirs, *files]:
            src = Path(folder) / name
            dst = target_folder / name
            info = os.lstat(src)
            if os.path.lexists(dst):
                continue
            if stat.S_ISDIR(info.st_mode):
                dst.mkdir(mode=stat.S_IMODE(info.st_mode) | 0o700)
            elif stat.S_ISLNK(info.st_mode):
                os.symlink(os.readlink(src), dst)
            elif stat.S_ISREG(info.st_mode):
                shutil.copyfile(src, dst, follow_symlinks=False)
                os.chmod(dst, stat.S_IMODE(info.st_mode) & 0o777)
            else:
                continue  # devices, FIFOs and sockets stay in the image
            with contextlib.suppress(OSError):
                os.lchown(dst, *owner)
            copied += 1
        # Only into folders this copy made or that were there: os.walk goes below both.
        dirs[:] = [d for d in dirs if _real_folder(target_folder / d)]
    return copied


def _real_folder(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False
