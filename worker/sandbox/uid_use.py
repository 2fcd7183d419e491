"""Whether a claimed uid ever had a process: a uid that never ran anything has nothing in the
kernel to reset when its run lets it go.

A run of the file tools alone never starts a process as its uid: the tools pool reads and writes
its workspace as the worker, and what it makes there goes with the workspace. Nothing of the uid
is then in the kernel (no process, key, IPC object, nor file at the top of /tmp), and resetting
it (``uid_reset``, a scan of /proc, the IPC tables and the shared folders) finds nothing.

So before anything runs as a claimed uid (a command, a shell session, a run's image container),
its starter notes the uid used here: a file named by the uid in ``<root>/.toolq/uids-used``, a
folder that is the workers' alone (``.toolq`` is 0700), which no run can write, so a run can
neither remove its own note nor make another's. The note goes only when a reset has shown the
uid clean (``identity.release``); a note left by a run whose release did not finish makes the
next holder's release reset the uid, the safe side.
"""

from __future__ import annotations

import os
from pathlib import Path

from worker.state_folder import STATE_DIR

USED = "uids-used"
_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC


def note_used(root: Path, uid: int) -> None:
    """Note that a process is about to run as ``uid``, claimed under the workspace root
    ``root``. Raises ``OSError`` when it cannot be noted: then nothing may run as the uid."""
    notes = Path(root) / STATE_DIR / USED
    try:
        fd = os.open(notes / str(uid), _FLAGS, 0o600)
    except FileNotFoundError:
        # Made where the uid's claim was not (a folder given an identity of its own): the
        # workers' alone, as the claims' state folder is.
        for folder in (notes.parent, notes):
            folder.mkdir(mode=0o700, exist_ok=True)
        fd = os.open(notes / str(uid), _FLAGS, 0o600)
    os.close(fd)


def was_used(root: Path, uid: int) -> bool:
    """Whether anything may have run as ``uid`` since its note was last cleared: a note that
    cannot be read counts as one."""
    try:
        os.lstat(Path(root) / STATE_DIR / USED / str(uid))
    except FileNotFoundError:
        return False
    except OSError:
        return True
    return True


def forget_use(root: Path, uid: int) -> None:
    """Clear ``uid``'s note, once a reset showed that nothing of it is left."""
    (Path(root) / STATE_DIR / USED / str(uid)).unlink(missing_ok=True)
