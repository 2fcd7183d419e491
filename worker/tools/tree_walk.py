"""A directory tree walked from a descriptor, top-down, never following a symbolic link: each
directory below is opened from its parent's descriptor with ``O_NOFOLLOW``, so one swapped for
a link after it was listed is skipped, not followed; only the directories on the way down are
held open, however wide the tree."""

from __future__ import annotations

import os
from collections.abc import Iterator

DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC

#: One directory of a walk: its path relative to the top ("" for the top itself), its
#: descriptor, its sorted subdirectory names (the caller may prune them in place) and its
#: sorted other names.
Walked = tuple[str, int, list[str], list[str]]


def scan_directory(fd: int) -> list[os.DirEntry[str]]:
    """The entries of the directory open at ``fd``."""
    with os.scandir(fd) as entries:
        return list(entries)


def listing(fd: int) -> tuple[list[str], list[str]]:
    """The sorted subdirectory names and other names of the directory open at ``fd``."""
    dirs: list[str] = []
    others: list[str] = []
    for item in scan_directory(fd):
        try:
            is_dir = item.is_dir(follow_symlinks=False)
        except OSError:
            continue
        (dirs if is_dir else others).append(item.name)
    return sorted(dirs), sorted(others)


def walk_below(top: int, dirs: list[str], files: list[str]) -> Iterator[Walked]:
    """The walk of the tree open at ``top`` (listed as ``dirs`` and ``files``); it owns ``top``
    and closes it, with every descriptor it opened, when it ends or is closed."""
    open_dirs: list[tuple[str, int, Iterator[str]]] = [("", top, iter(dirs))]
    try:
        yield "", top, dirs, files
        while open_dirs:
            rel, fd, names = open_dirs[-1]
            name = next(names, None)
            if name is None:
                open_dirs.pop()
                os.close(fd)
                continue
            try:
                child = os.open(name, DIRECTORY_FLAGS, dir_fd=fd)
            except OSError:
                continue  # gone, or swapped for a symlink, since it was listed
            try:
                child_dirs, child_files = listing(child)
            except OSError:
                os.close(child)
                continue
            child_rel = os.path.join(rel, name)
            open_dirs.append((child_rel, child, iter(child_dirs)))
            yield child_rel, child, child_dirs, child_files
    finally:
        for _, fd, _ in open_dirs:
            os.close(fd)
