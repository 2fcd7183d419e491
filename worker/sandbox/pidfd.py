"""A process's exit status read through a pidfd, whoever reaped it.

Since Linux 6.15 the ``PIDFD_GET_INFO`` ioctl tells a process's exit status to anyone holding a
pidfd to it, also after its parent has reaped it. A namespace's init that reaps its command at
once (bash does, from its SIGCHLD handler) then still lets the worker read the exact status: a
signal told apart from an exit status above 128.
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import os
import select
import struct
import subprocess

_PIDFS_IOCTL_MAGIC = 0xFF
#: ``struct pidfd_info`` as Linux 6.15 first gave it (``PIDFD_INFO_SIZE_VER0``).
_INFO_SIZE = 64
#: ``_IOWR(PIDFS_IOCTL_MAGIC, 11, struct pidfd_info)``.
PIDFD_GET_INFO = (3 << 30) | (_INFO_SIZE << 16) | (_PIDFS_IOCTL_MAGIC << 8) | 11
PIDFD_INFO_EXIT = 1 << 3
#: Where ``exit_code`` (a wait status) sits: after mask, cgroupid and eleven 32-bit ids.
_EXIT_CODE_AT = 8 + 8 + 11 * 4


def exit_status(pidfd: int) -> int | None:
    """The exit status of ``pidfd``'s process as ``subprocess`` gives it (negative: the signal
    that killed it), or None while it runs or when this kernel cannot tell."""
    info = bytearray(_INFO_SIZE)
    struct.pack_into("=Q", info, 0, PIDFD_INFO_EXIT)
    try:
        fcntl.ioctl(pidfd, PIDFD_GET_INFO, info)
    except OSError:
        return None
    (mask,) = struct.unpack_from("=Q", info, 0)
    if not mask & PIDFD_INFO_EXIT:
        return None
    (status,) = struct.unpack_from("=i", info, _EXIT_CODE_AT)
    try:
        return os.waitstatus_to_exitcode(status)
    except ValueError:
        return None


def has_exited(pidfd: int, timeout_s: float | None = 0.0) -> bool:
    """``pidfd``'s process has exited (its pidfd turns readable then), waiting at most
    ``timeout_s`` for it (None: until it has)."""
    poller = select.poll()
    poller.register(pidfd, select.POLLIN)
    return bool(poller.poll(None if timeout_s is None else timeout_s * 1000))


#: The capability without which /proc shows the exit code of another uid's zombie as 0.
_CAP_SYS_PTRACE = 19


@functools.lru_cache(maxsize=1)
def zombie_codes_readable() -> bool:
    """This worker reads its commands' exit codes from their zombies' /proc entries: the kernel
    shows another uid's as 0 to a reader without CAP_SYS_PTRACE (a root worker in a pod's user
    namespace, with the deploy's capabilities). A worker that is not root runs its commands as
    its own uid."""
    if os.geteuid() != 0:
        return True
    try:
        with open("/proc/self/status") as status:
            effective = next(line for line in status if line.startswith("CapEff:"))
    except (OSError, StopIteration):
        return False
    return bool(int(effective.split()[1], 16) >> _CAP_SYS_PTRACE & 1)


@functools.lru_cache(maxsize=1)
def tells_exit_after_reaping() -> bool:
    """This kernel tells a reaped process's exit status through a pidfd taken before: probed
    once, with a child that exits with 3."""
    try:
        child = subprocess.Popen(
            ["/bin/sh", "-c", "exit 3"], stdin=subprocess.DEVNULL, env={}, close_fds=True
        )
    except OSError:
        return False
    try:
        pidfd = os.pidfd_open(child.pid)
    except OSError:
        child.wait()
        return False
    try:
        child.wait(10)
        return exit_status(pidfd) == 3
    except subprocess.TimeoutExpired:
        with contextlib.suppress(OSError):
            child.kill()
        child.wait()
        return False
    finally:
        os.close(pidfd)
