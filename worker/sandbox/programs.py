"""What a plan needs from this machine besides namespaces and control groups: the sandbox
user's ids, the programs that put the layers in place, and whether a command's signals need
giving back."""

from __future__ import annotations

import pwd
import shutil
import signal

from worker.exceptions import SandboxError
from worker.sandbox.config import SAFE_PATH

#: The signals a shell ignores in its background jobs, which a command gets back.
_RESTORED = (signal.SIGINT, signal.SIGQUIT)


def signals_ignored_here() -> bool:
    """This process ignores SIGINT or SIGQUIT (as a program started in the background of a
    script does), and so would every process it starts unless one gives them back."""
    return any(signal.getsignal(number) is signal.SIG_IGN for number in _RESTORED)


def sandbox_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(
            f"the sandbox user {user!r} does not exist; create it or set TOOLQ_SANDBOX_USER"
        ) from None
    if entry.pw_uid == 0:
        raise SandboxError(f"the sandbox user {user!r} is root; choose an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def require_binary(name: str, purpose: str) -> str:
    found = shutil.which(name, path=SAFE_PATH)
    if found is None:
        raise SandboxError(
            f"{name} (util-linux) is needed to {purpose} when the worker runs as root"
        )
    return found
