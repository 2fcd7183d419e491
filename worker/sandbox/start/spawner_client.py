"""The worker's side of its spawner (``worker.sandbox.start.spawner_process``): starting it on
first use, asking it for a launch, and the launch's first process as the worker sees it (not its
child)."""

from __future__ import annotations

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Protocol

from worker.exceptions import SandboxError
from worker.sandbox.bounded import wait_at_most
from worker.sandbox.config import COMMAND_ENV, REAP_BOUND_S
from worker.sandbox.pidfd import exit_status, has_exited
from worker.sandbox.start.spawner_process import MAX_MESSAGE

SPAWNER = Path(__file__).with_name("spawner_process.py")
#: How often a first process that exited is looked at until its spawner has reaped it.
_REAPED_TICK_S = 0.001


class LaunchedProcess(Protocol):
    """A launch's first process: a ``subprocess.Popen``, or one the spawner made."""

    pid: int
    stdout: IO[bytes] | None
    stderr: IO[bytes] | None
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


class SpawnedProcess:
    """A launch's first process made by the spawner: followed through a pidfd, its exit status
    told by the kernel once the spawner reaped it."""

    def __init__(self, pid: int, stdout: int, stderr: int) -> None:
        self.pid = pid
        self.stdout: IO[bytes] | None = open(stdout, "rb", buffering=0)  # noqa: SIM115
        self.stderr: IO[bytes] | None = open(stderr, "rb", buffering=0)  # noqa: SIM115
        self.returncode: int | None = None
        try:
            self._pidfd: int | None = os.pidfd_open(pid)
        except OSError:  # gone already, and reaped: nothing to follow
            self._pidfd, self.returncode = None, -signal.SIGKILL

    def poll(self) -> int | None:
        return self.wait(0) if self._exited(0) else None

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            assert self._pidfd is not None
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if self._exited(left):
                # Readable at the exit; the status is told once the spawner has reaped it.
                self.returncode = exit_status(self._pidfd)
            if self.returncode is None:
                if deadline is not None and time.monotonic() >= deadline:
                    raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
                time.sleep(_REAPED_TICK_S)
        return self.returncode

    def close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None

    def _exited(self, timeout: float | None) -> bool:
        return self._pidfd is None or has_exited(self._pidfd, timeout)


class Spawner:
    """This worker process's spawner, started on first use and again after a fork or a crash.
    It ends when this process does (its end of the control socket closes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._proc: subprocess.Popen[bytes] | None = None
        self._control: socket.socket | None = None

    def launch(
        self,
        join: Sequence[str],
        drop: tuple[int, int] | None,
        started_in: str,
        shell: Sequence[str] | None,
        limits: Mapping[str, tuple[int, int]],
        private: Mapping[str, object] | None = None,
    ) -> tuple[SpawnedProcess, socket.socket]:
        """A launch in the groups of ``join``: its first process and the socket to its init.
        ``shell``: the argv the process forked ahead becomes before the call, under ``limits``
        and with ``COMMAND_ENV`` (None: it reads the call itself). ``private``: the folders the
        namespace covers, and those it binds back (``spawner_process._cover``)."""
        request: dict[str, object] = {
            "join": list(join),
            "drop": drop,
            "ready_in": started_in,
            "shell": None if shell is None else list(shell),
            "env": COMMAND_ENV,
            "limits": dict(limits),
            "private": None if private is None else dict(private),
        }
        data = json.dumps(request).encode()
        with self._lock:
            control = self._running()
            try:
                control.send(data)
                message, fds, _, _ = socket.recv_fds(control, MAX_MESSAGE, 3)
            except OSError as exc:
                self._stop()
                raise SandboxError(f"the sandbox's spawner is gone: {exc}") from exc
        if not message:
            self._stop()
            raise SandboxError("the sandbox's spawner exited")
        answer = json.loads(message)
        if "error" in answer or len(fds) != 3:
            for fd in fds:
                os.close(fd)
            raise SandboxError(f"the command could not be started: {answer.get('error')}")
        channel, stdout, stderr = fds
        return SpawnedProcess(answer["pid"], stdout, stderr), socket.socket(fileno=channel)

    def stop(self) -> None:
        with self._lock:
            self._stop()

    def _running(self) -> socket.socket:
        if os.getpid() != self._pid:  # a forked child shares nothing of its parent's spawner
            self._pid, self._proc, self._control = os.getpid(), None, None
        if self._proc is not None and self._proc.poll() is None and self._control is not None:
            return self._control
        self._stop()
        control, its_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(SPAWNER), str(its_end.fileno())],
                pass_fds=(its_end.fileno(),),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                env={},
                cwd="/",
                start_new_session=True,
            )
        except OSError as exc:
            control.close()
            raise SandboxError(f"the sandbox's spawner could not start: {exc}") from exc
        finally:
            its_end.close()
        self._control = control
        return control

    def _stop(self) -> None:
        if self._control is not None:
            self._control.close()
            self._control = None
        if self._proc is not None:
            # It exits once its end of the control socket is closed.
            wait_at_most(self._proc, REAP_BOUND_S, "the sandbox's spawner")
            self._proc = None


spawner = Spawner()
# Stopped after the launcher lets its launches go (registered later, run earlier).
atexit.register(spawner.stop)
