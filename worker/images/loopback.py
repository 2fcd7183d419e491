"""Loopback up in a box's network namespace: a box has no network, but ``localhost`` works in
it, as in Docker's ``--network none``. (runsc's own network stack brings it up itself.)"""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct
import threading

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
#: struct ifreq: a 16-byte name, then a 24-byte union whose first field is the flags.
_IFREQ = struct.Struct("16sH22x")


def loopback_up(pid: int) -> None:
    """Bring ``lo`` up in the network namespace of process ``pid``; ``OSError`` if it cannot.

    A namespace is joined by one thread, not the process: a thread of its own joins it, sets
    the flag and ends, and the worker's other threads never leave their namespace."""
    failed: list[OSError] = []

    def join_and_set() -> None:
        try:
            fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
            try:
                if _libc.setns(fd, _CLONE_NEWNET) != 0:
                    errno = ctypes.get_errno()
                    raise OSError(errno, f"setns: {os.strerror(errno)}")
            finally:
                os.close(fd)
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", _IFF_UP_LOOPBACK_RUNNING))
        except OSError as exc:
            failed.append(exc)

    thread = threading.Thread(target=join_and_set, name="toolq-loopback")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
