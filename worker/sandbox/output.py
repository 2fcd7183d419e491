"""Reading a command's output as it comes: both pipes pumped at once, each kept up to the cap
(the rest is read and counted, never held), and the moment the started process exits noticed."""

from __future__ import annotations

import codecs
import contextlib
import os
import selectors
import time
from collections.abc import Callable
from typing import IO

from worker.sandbox.start.spawner_client import LaunchedProcess

_READ_CHUNK = 65_536


class CappedStream:
    """One pipe's first ``cap`` bytes; the rest is read and counted but not kept."""

    def __init__(self, pipe: IO[bytes], cap: int) -> None:
        self.pipe = pipe
        self.fd = pipe.fileno()
        self.cap = cap
        self.kept = bytearray()
        self.total = 0
        self.at_eof = False
        os.set_blocking(self.fd, False)

    @property
    def truncated(self) -> bool:
        return self.total > self.cap

    def take(self, chunk: memoryview) -> None:
        room = self.cap - len(self.kept)
        if room > 0:
            self.kept += chunk[:room]
        self.total += len(chunk)

    def text(self) -> str:
        if not self.truncated:
            return self.kept.decode("utf-8", "replace")
        # Not final: a character cut in half by the cap is dropped rather than mangled.
        shown = codecs.getincrementaldecoder("utf-8")("replace").decode(self.kept, final=False)
        total = f"{self.total:,}" if self.at_eof else f"at least {self.total:,}"
        return f"{shown}\n[output truncated: showing the first {self.cap:,} of {total} bytes]"

    def remove_suffix(self, suffix: bytes) -> bool:
        """Forget ``suffix`` if the whole stream ended with it."""
        if self.truncated or not self.kept.endswith(suffix):
            return False
        del self.kept[-len(suffix) :]
        self.total -= len(suffix)
        return True

    def close(self) -> None:
        self.pipe.close()


#: Called when its file descriptor is readable; may give a pidfd whose process's exit ends the
#: command (the namespace's init telling that the command started).
Notice = Callable[[], "int | None"]


class Pump:
    """Reads both pipes as data comes, and notices when the command exits: the started process,
    or the one a notice names."""

    def __init__(
        self,
        proc: LaunchedProcess,
        streams: tuple[CappedStream, ...],
        notices: tuple[tuple[int, Notice], ...] = (),
        exit_fd: int | None = None,
    ) -> None:
        """``exit_fd``: a pidfd whose process's exit ends the command (its owner closes it);
        by default the started process's, opened here."""
        self._proc = proc
        self._selector = selectors.PollSelector()
        self._buffer = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buffer)
        self._open = len(streams)
        for stream in streams:
            self._selector.register(stream.fd, selectors.EVENT_READ, stream)
        self._exit_fd: int | None = None
        self._command_fd: int | None = None
        if exit_fd is not None:
            self._selector.register(exit_fd, selectors.EVENT_READ, None)
        else:
            with contextlib.suppress(OSError, AttributeError):
                self._exit_fd = os.pidfd_open(proc.pid)
                self._selector.register(self._exit_fd, selectors.EVENT_READ, None)
        self._exit_known = exit_fd is not None or self._exit_fd is not None
        for fd, notice in notices:
            self._selector.register(fd, selectors.EVENT_READ, notice)

    def __enter__(self) -> Pump:
        return self

    def __exit__(self, *exc: object) -> None:
        self._selector.close()
        self._view.release()
        for fd in (self._exit_fd, self._command_fd):
            if fd is not None:
                os.close(fd)

    def until_exit(self, deadline: float) -> bool:
        """Read until the process exits (True) or ``deadline`` passes (False)."""
        # Without a pidfd (kernels before 5.3) the exit is polled on a short tick.
        tick = None if self._exit_known else 0.02
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            wait = remaining if tick is None else min(tick, remaining)
            exited = False
            for key, _ in self._selector.select(wait):
                if key.data is None:
                    exited = True
                elif isinstance(key.data, CappedStream):
                    self._read(key.data)
                else:
                    self._selector.unregister(key.fd)
                    self._watch(key.data())
            if exited or (tick is not None and _has_exited(self._proc.pid)):
                return True

    def drain(self, deadline: float) -> None:
        """Read what is left, until both pipes close or ``deadline`` passes."""
        for key in list(self._selector.get_map().values()):
            if not isinstance(key.data, CappedStream):
                self._selector.unregister(key.fd)
        while self._open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for key, _ in self._selector.select(remaining):
                self._read(key.data)

    def drain_buffered(self) -> None:
        """Read what the pipes hold now, without waiting for them to close: for a command that
        ended alone, whose pipes stay open in the init's processes. All it wrote is read then."""
        for key in list(self._selector.get_map().values()):
            stream = key.data
            if isinstance(stream, CappedStream):
                while self._read(stream):
                    pass
                if not stream.at_eof:
                    stream.at_eof = True
                    self._selector.unregister(stream.fd)
                    self._open -= 1

    def _watch(self, pidfd: int | None) -> None:
        if pidfd is not None:
            self._command_fd = pidfd
            self._selector.register(pidfd, selectors.EVENT_READ, None)

    def _read(self, stream: CappedStream) -> bool:
        """Read one chunk; False when there was none (nothing yet, or the pipe closed)."""
        try:
            count = os.readv(stream.fd, [self._buffer])
        except BlockingIOError:
            return False
        if count == 0:
            stream.at_eof = True
            self._selector.unregister(stream.fd)
            self._open -= 1
            return False
        stream.take(self._view[:count])
        return True


def _has_exited(pid: int) -> bool:
    # WNOWAIT leaves the process unreaped, so its pid (and process group) cannot be reused
    # before its leftovers are killed.
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None
