"""Children that die with this process: each gets a parent-death signal (SIGKILL), so a toolq
process killed outright (SIGKILL, the OOM killer) leaves no redis-server or worker behind.

The kernel sends that signal when the *thread* that forked the child ends, not the process. A
child started from a short-lived thread (a worker thread of asyncio or anyio, which ends once
idle, as Inspect's ``task_init`` runs on) would die with that thread. So every child is forked
by one thread of this module that lasts as long as the process; ``spawn`` hands it the start
and waits for it. A Celery worker's own pool processes get the same signal from Celery, when
their parent dies.
"""

from __future__ import annotations

import ctypes
import os
import queue
import signal
import subprocess
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import IO

_PR_SET_PDEATHSIG = 1


def _prctl() -> Callable[..., int] | None:
    """libc's prctl, looked up before any fork: the child only calls it."""
    function = getattr(ctypes.CDLL(None, use_errno=True), "prctl", None)
    if function is None:  # not Linux: the stack's record alone clears what a kill left
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    function.restype = ctypes.c_int
    return function  # type: ignore[no-any-return]


_PRCTL = _prctl()


def _die_with(parent: int) -> Callable[[], None] | None:
    """What the child runs between fork and exec: the signal, and a check that the parent did
    not die before it was set (the signal would then never come)."""
    prctl = _PRCTL
    if prctl is None:
        return None

    def set_parent_death_signal() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0)
        if os.getppid() != parent:
            os._exit(1)

    return set_parent_death_signal


class _Starter:
    """The thread that forks every child: started on first use, alive until the process
    ends (a daemon thread is never ended before)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._requests: queue.SimpleQueue[
            tuple[Callable[[], subprocess.Popen[bytes]], Future[subprocess.Popen[bytes]]]
        ] = queue.SimpleQueue()

    def start(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        with self._lock:
            # After a fork of this process the thread is not there: a new one is made.
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._serve, name="toolq-children", daemon=True
                )
                self._thread.start()
        started: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((start, started))
        return started.result()

    def _serve(self) -> None:
        while True:
            start, started = self._requests.get()
            try:
                started.set_result(start())
            except BaseException as exc:  # the caller raises it
                started.set_exception(exc)


#: One for the process: the parent-death signal is owed to the thread, and the process has one
#: lifetime.
_STARTER = _Starter()


def spawn(argv: list[str], *, env: dict[str, str], output: IO[bytes]) -> subprocess.Popen[bytes]:
    """``argv`` started as a child that the kernel kills (SIGKILL) when this process ends,
    however it ends: in a session of its own, stdin from /dev/null, stdout and stderr to
    ``output``."""
    preexec = _die_with(os.getpid())
    return _STARTER.start(
        lambda: subprocess.Popen(
            argv,
            stdout=output,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
            # Two system calls before exec, nothing that waits on a lock of another thread.
            preexec_fn=preexec,
        )
    )
