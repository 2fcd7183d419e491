"""Doing something inside another process's network namespace: a thread of its own joins it,
does it and ends, so the worker's other threads never leave their namespace. A socket keeps
the namespace it was made in: a listening socket made here accepts the namespace's
connections while the worker serves it from its own."""

from __future__ import annotations

import ctypes
import ctypes.util
import fcntl
import os
import socket
import struct
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

_libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
_CLONE_NEWNET = 0x40000000
_SIOCSIFFLAGS = 0x8914
_IFF_UP_LOOPBACK_RUNNING = 0x1 | 0x8 | 0x40
#: struct ifreq: a 16-byte name, then a 24-byte union whose first field is the flags.
_IFREQ = struct.Struct("16sH22x")

T = TypeVar("T")


def separate_namespace(pid: int) -> bool:
    """Process ``pid`` is in a network namespace other than this worker's."""
    theirs = os.stat(f"/proc/{pid}/ns/net")
    ours = os.stat("/proc/self/ns/net")
    return (theirs.st_dev, theirs.st_ino) != (ours.st_dev, ours.st_ino)


def in_network_of(pid: int, action: Callable[[], T]) -> T:
    """``action()`` run in the network namespace of process ``pid``; ``OSError`` if it cannot
    be joined, or what ``action`` raised."""

    def join_and_act() -> T:
        fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            if _libc.setns(fd, _CLONE_NEWNET) != 0:
                errno = ctypes.get_errno()
                raise OSError(errno, f"setns: {os.strerror(errno)}")
        finally:
            os.close(fd)
        return action()

    # A pool of its own: its one thread ends with it, never to serve anything else.
    with ThreadPoolExecutor(1, "toolq-netns") as pool:
        return pool.submit(join_and_act).result()


def bring_loopback_up() -> None:
    """``lo`` up in the calling thread's network namespace (a new one has it down)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        fcntl.ioctl(sock, _SIOCSIFFLAGS, _IFREQ.pack(b"lo", _IFF_UP_LOOPBACK_RUNNING))


def listener_in(pid: int) -> socket.socket:
    """A TCP socket listening on ``127.0.0.1`` (a port the kernel picks) in the network
    namespace of ``pid``, its loopback brought up; ``OSError`` if it cannot be made."""

    def listen() -> socket.socket:
        bring_loopback_up()
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.bind(("127.0.0.1", 0))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        return sock

    return in_network_of(pid, listen)
