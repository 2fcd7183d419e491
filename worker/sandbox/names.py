"""A name for a run's uid inside its view: ``id -un``, ``whoami``, ``ls -l`` and programs that
look their user up (``git``, ``ssh``) find it.

A run's uid is taken from ``TOOLQ_SANDBOX_UID_RANGE``, which the machine's ``/etc/passwd`` does
not name. Where a run's calls have a mount namespace of their own, the worker binds, over
``/etc/passwd`` and ``/etc/group`` in that namespace only, copies of the machine's files with one
line more: ``toolq-run``, the run's uid and gid, its workspace as home. The copies are the
worker's (root's, mode 0644): a run reads them and cannot change them; the machine's files stay
as they are, and other runs see their own name.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

#: The name a run's uid and gid have inside the run's view.
RUN_USER = "toolq-run"
NAMES = "names"
#: The machine's files the copies start from.
PASSWD = Path("/etc/passwd")
GROUP = Path("/etc/group")
#: The run's own files, by the path they are bound over.
BOUND = {"/etc/passwd": "passwd", "/etc/group": "group"}


def names_folder(state: Path, key: str) -> Path:
    """Where the copies for the run named ``key`` are kept, under a fleet's state folder."""
    name = key if "/" not in key else hashlib.sha256(key.encode()).hexdigest()[:32]
    return state / NAMES / name


def passwd_text(host: str, uid: int, gid: int, home: str) -> str:
    """``host``'s passwd lines, with any for ``uid`` or ``RUN_USER`` dropped and the run's
    added."""
    kept = [line for line in host.splitlines() if not _names(line, RUN_USER, uid)]
    return "\n".join([*kept, f"{RUN_USER}:x:{uid}:{gid}:toolq run:{home}:/bin/sh"]) + "\n"


def group_text(host: str, gid: int) -> str:
    """``host``'s group lines, with any for ``gid`` or ``RUN_USER`` dropped and the run's
    added."""
    kept = [line for line in host.splitlines() if not _names(line, RUN_USER, gid)]
    return "\n".join([*kept, f"{RUN_USER}:x:{gid}:"]) + "\n"


def _names(line: str, name: str, number: int) -> bool:
    fields = line.split(":")
    return len(fields) > 2 and (fields[0] == name or fields[2] == str(number))


def make_run_names(folder: Path, uid: int, gid: int, home: str) -> tuple[tuple[str, str], ...]:
    """The run's passwd and group files in ``folder`` (written where missing, whole or not at
    all), as (source, target) pairs to bind."""
    folder.mkdir(parents=True, exist_ok=True, mode=0o755)
    for name in BOUND.values():
        path = folder / name
        if path.is_file():
            continue
        if name == "passwd":
            text = passwd_text(_read(PASSWD), uid, gid, home)
        else:
            text = group_text(_read(GROUP), gid)
        partial = folder / f".{name}.{os.getpid()}"
        partial.write_text(text)
        os.chmod(partial, 0o644)
        os.replace(partial, path)
    return tuple((str(folder / name), target) for target, name in BOUND.items())


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
