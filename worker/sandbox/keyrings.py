"""The kernel's keyrings, as the sandbox uses them: a session keyring of each call's own, and the
keyrings a uid keeps between calls cleared before the uid serves another run.

A process without a session keyring of its own falls back to its uid's user-session keyring,
which every process of the uid shares and which outlives them all: a key one run put there would
be read by the next run given the uid. Each launch is therefore started with a new, empty session
keyring (``own_session_keyring``): what a command adds to it goes with the call's last process.
A command can still add to its uid's user keyring (``@u``); ``clear_uid_keyrings`` empties it,
with the user-session and persistent keyrings, as that uid.

There is no wrapper for ``keyctl(2)`` in the C library (libkeyutils has one), so the system call
is made by number.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import shutil
import subprocess
import sys
from collections.abc import Iterator

#: ``keyctl``'s number on the architectures toolq's images are built for.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(platform.machine())
KEYCTL_JOIN_SESSION_KEYRING = 1

#: Run as the uid whose keyrings are cleared (``sys.argv[1]``: the keyctl number): clears its
#: user, user-session and persistent keyrings and reads them back; exits 0 when all are empty,
#: 1 naming what is left, 2 when a keyring cannot be cleared.
_CLEAR_SCRIPT = """
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
keyctl = lambda *a: libc.syscall(int(sys.argv[1]), *(ctypes.c_long(x) for x in a))
CLEAR, READ, INVALIDATE, PERSISTENT, PROCESS = 7, 11, 21, 22, -2
rings = {"user": -4, "user-session": -5}
left = []
for name, ring in rings.items():
    if keyctl(CLEAR, ring) != 0:
        print(f"cannot clear the {name} keyring: errno {ctypes.get_errno()}")
        sys.exit(2)
    if keyctl(READ, ring, 0, 0) != 0:
        left.append(name)
# The persistent keyring goes whole (a new, empty one is made when asked for): so the uid owns
# its two keyrings alone again, which the worker can tell without starting this.
persistent = keyctl(PERSISTENT, -1, PROCESS)
if persistent >= 0 and keyctl(INVALIDATE, persistent) != 0:
    left.append("persistent")
if left:
    print("keys left in the " + ", ".join(left) + " keyring(s)")
    sys.exit(1)
"""
#: How long clearing a uid's keyrings may take (a Python started as that uid).
CLEAR_BOUND_S = 30.0


def join_new_session_keyring() -> bool:
    """Give the calling thread a new, empty, anonymous session keyring; False where the kernel
    has none to give (no keyrings, or the owner's key quota is used up)."""
    if SYS_KEYCTL is None:
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    operation = (ctypes.c_long(KEYCTL_JOIN_SESSION_KEYRING), ctypes.c_long(0))
    joined: int = libc.syscall(SYS_KEYCTL, *operation)
    return joined >= 0


@contextlib.contextmanager
def own_session_keyring() -> Iterator[str | None]:
    """Processes this thread starts inside have a session keyring of their own, which nothing
    else holds; the thread takes another afterwards, so it keeps no hold on theirs. Yields why
    none could be made, or None.

    A session keyring belongs to a thread's credentials, not its process's: the worker's other
    threads are unaffected."""
    joined = join_new_session_keyring()
    why = None if joined else f"{os.strerror(ctypes.get_errno())} (see /proc/sys/kernel/keys)"
    try:
        yield why
    finally:
        if joined:
            join_new_session_keyring()


def session_keyrings_work() -> bool:
    """This machine gives a thread a session keyring of its own."""
    with own_session_keyring() as failure:  # the probe's own goes after
        return failure is None


def _python() -> str:
    """A Python the uid may run: the commands' own (the worker's may lie in a folder closed to
    other users, as root's home)."""
    return shutil.which("python3", path="/usr/local/bin:/usr/bin:/bin") or sys.executable


def _owns_keys(uid: int) -> bool:
    """``uid`` may hold a key worth clearing: the kernel counts more keys of the uid than its two
    keyrings, the user and user-session ones, made together and empty once cleared (the line of
    ``/proc/key-users`` for it, as this user namespace sees uids)."""
    try:
        with open("/proc/key-users") as users:
            for line in users:
                owner, _, counts = line.partition(":")
                if owner.strip() == str(uid):
                    return int(counts.split()[1].split("/")[0]) > 2
    except (OSError, IndexError, ValueError):
        return True
    return False


def clear_uid_keyrings(uid: int) -> str | None:
    """Empty ``uid``'s user, user-session and persistent keyrings, as that uid, in this worker's
    user namespace (where the kernel keeps them). Returns what is left, or None when all are
    empty."""
    if SYS_KEYCTL is None or not _owns_keys(uid):
        return None  # no key of the uid anywhere: nothing a run could have left
    try:
        done = subprocess.run(
            [_python(), "-I", "-S", "-c", _CLEAR_SCRIPT, str(SYS_KEYCTL)],
            user=uid,
            group=uid,
            extra_groups=[],
            env={},
            cwd="/",
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=CLEAR_BOUND_S,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"its keyrings could not be cleared: {exc}"
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines()
        return said[-1] if said else f"clearing its keyrings exited with {done.returncode}"
    return None
