"""Ending a command: killing it and everything it started, reaping it, and reading how it ended
and what it used.

With a control group, every process of the command is in the group from its first instruction:
the group is killed at once, and what was in it is counted. Without one, the process group is
killed, the namespace's first process by pid, and (without a PID namespace) the processes that
carry the command's marker.
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import selectors
import signal
import socket
import subprocess
import time
from dataclasses import InitVar, dataclass, replace

from worker.plumbing.proc_stat import process_alive
from worker.sandbox.bounded import poll_until
from worker.sandbox.call_cgroup import CallGroup
from worker.sandbox.cgroup_layout import stat_fields
from worker.sandbox.config import REAP_BOUND_S
from worker.sandbox.output import CappedStream
from worker.sandbox.pidfd import exit_status, zombie_codes_readable
from worker.sandbox.plan import Plan
from worker.sandbox.result import NO_USAGE, Usage
from worker.sandbox.start.proc_lookup import ForkedCommand, children, find_forked
from worker.sandbox.start.spawner_client import LaunchedProcess
from worker.sandbox.sweep import sweep_marked

log = logging.getLogger(__name__)

#: What util-linux's unshare (2.38) prints, exiting with 1, when its child died of SIGKILL.
_UNSHARE_SAW_SIGKILL = b"unshare: sigprocmask unblock failed: Invalid argument\n"


@dataclass(eq=False)
class Ending:
    """How one started command ends: ``kill_everything`` once it exited or its time is up, then
    ``reap`` for its exit status and ``usage`` for what it used."""

    proc: LaunchedProcess
    plan: Plan
    marker: str
    group: CallGroup | None
    init_socket: socket.socket | None
    #: The command the init forked ahead, when it did (``Plan.forks_ahead``).
    forked: InitVar[ForkedCommand | None] = None

    def __post_init__(self, forked: ForkedCommand | None) -> None:
        #: The command under the namespace's init, once the init said it started it, or from
        #: the start when the init forked it ahead.
        self._init_pid = None if forked is None else forked.init_pid
        self._command_pid = None if forked is None else forked.pid
        #: Its pidfd (the pump closes it; the launch, when forked ahead).
        self.command_pidfd = None if forked is None else forked.pidfd
        self._command_status: int | None = None
        self._killed: int | None = None
        #: The command ended alone (``ended_alone``): ``finish`` ends the rest, after the answer.
        self.ends_later = False
        self._rusage: resource.struct_rusage | None = None

    def command_started(self) -> int | None:
        """The init's word that the command started: a pidfd that is readable once the command
        has exited, or None (the init is gone, or the command could not be found)."""
        assert self.init_socket is not None
        with contextlib.suppress(OSError):
            if not self.init_socket.recv(16):
                return None
            forked = find_forked(self.proc.pid)
            if forked is not None:
                self._init_pid, self._command_pid = forked.init_pid, forked.pid
                self.command_pidfd = forked.pidfd
                return forked.pidfd
        # Without the command's pid its status cannot be read: let the init wait for it instead.
        self.init_socket.close()
        return None

    def kill_everything(self) -> None:
        """Kill the started process and every process the command left behind; wait until gone."""
        deadline = time.monotonic() + REAP_BOUND_S
        if self.group is None:
            _kill_without_group(self.proc, self.plan, self.marker)
            return
        if self.plan.has_init and self._init_pid is None:
            self._init_pid = next(iter(children(self.proc.pid)), None)
        # The plan's own processes (unshare and the init) are killed with the rest, not counted.
        machinery = {self.proc.pid, self._init_pid} if self.plan.has_init else set()
        command = self._command_pid
        if command is not None and self.init_socket is not None and not process_alive(command):
            # The command has ended: its status is read from the zombie while the init has not
            # reaped it (it may have). What it left running is counted, then the init is told
            # to go: it reaps the command, exits with its status, and the namespace dies with
            # it, leftovers and all.
            self._command_status = self._ended_status(command)
            left = [pid for pid in self.group.members() if pid not in machinery]
            self._killed = len(left)
            self.init_socket.close()
            with contextlib.suppress(OSError):
                exited = os.pidfd_open(self.proc.pid)
                try:
                    _wait_readable([exited], deadline)
                finally:
                    os.close(exited)
            self.group.kill(deadline)
        else:
            killed = self.group.kill(deadline)
            self._killed = len([pid for pid in killed if pid not in machinery])
        self.group.wait_empty(deadline)

    def ended_alone(self) -> bool:
        """The command has exited, its status is known, and nothing it started is left: all it
        printed is in its pipes, and the rest (the init, the namespace, the group) may end after
        the answer (``finish``). Only the init's own processes hold the pipes then, and they
        write nothing."""
        command, group = self._command_pid, self.group
        if command is None or group is None or self.init_socket is None:
            return False
        status = self._ended_status(command)
        if status is None:
            return False
        machinery = {self.proc.pid, self._init_pid}
        if any(pid not in machinery for pid in group.members()):
            return False
        self._command_status, self._killed = status, 0
        self.ends_later = True
        return True

    def finish(self) -> None:
        """After ``ended_alone``: let the init go (it exits, and the namespace with it), reap
        the launch, and leave the group empty."""
        assert self.init_socket is not None and self.group is not None
        deadline = time.monotonic() + REAP_BOUND_S
        self.init_socket.close()
        self._wait()
        self.group.kill(deadline)
        self.group.wait_empty(deadline)
        self.ends_later = False

    def _ended_status(self, command: int) -> int | None:
        # Read from the zombie until the init reaps it (dash waits for the worker's word; bash
        # reaps at once), then told by the kernel through the pidfd: it keeps the status from
        # the reaping on. Asked again after the zombie: the reaping may fall in between.
        pidfd = self.command_pidfd
        if pidfd is None:
            return _exit_status(command)
        if not zombie_codes_readable():
            # Its zombie would show 0: the pidfd tells the status once the init has reaped it,
            # which it does at once.
            poll_until(lambda: exit_status(pidfd) is not None, time.monotonic() + REAP_BOUND_S)
            return exit_status(pidfd)
        for status in (exit_status(pidfd), _exit_status(command), exit_status(pidfd)):
            if status is not None:
                return status
        return None

    def reap(self, stderr: CappedStream) -> int | None:
        """The command's exit status (negative: the signal that killed it), or None when it
        could not be reaped."""
        if self.ends_later:
            return self._command_status
        returncode = self._wait()
        if self._command_status is not None:
            # Exact, a signal told apart from an exit status above 128, which the init's is not.
            stderr.remove_suffix(_UNSHARE_SAW_SIGKILL)
            return self._command_status
        if self.plan.namespaced and returncode == 1 and stderr.remove_suffix(_UNSHARE_SAW_SIGKILL):
            return -signal.SIGKILL
        return returncode

    def usage(self) -> Usage:
        """What the command used: from its control group, or without one the CPU time the
        kernel counted for the processes the command waited for. (Not their peak memory: a
        child started by vfork counts the worker's own memory until it execs.)"""
        if self.group is not None:
            counted = self.group.usage()
            peak = counted.pids_peak
            return Usage(
                cpu_ms=counted.cpu_ms,
                max_rss_kb=counted.max_rss_kb,
                pids_peak=None if peak is None else max(0, peak - self.plan.machinery),
                killed_processes=self._killed,
                oom_killed=counted.oom_killed,
                cpu_limit=counted.cpu_limit,
            )
        rusage = self._rusage
        if rusage is None:
            return NO_USAGE
        return replace(NO_USAGE, cpu_ms=round((rusage.ru_utime + rusage.ru_stime) * 1000))

    def _wait(self) -> int | None:
        """Reap the started process, keeping what the kernel counted for it and what it
        waited for; None if it is not gone in time (stuck in the kernel even after SIGKILL)."""
        proc = self.proc
        if proc.returncode is None:
            deadline = time.monotonic() + REAP_BOUND_S
            try:
                poll_until(self._reaped, deadline)
            except ChildProcessError:
                # Not ours to reap (the spawner's child), or reaped already by Popen: its
                # status comes when its reaper has it, which may be never (a reaper that died).
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(max(0.0, deadline - time.monotonic()))
            if proc.returncode is None:
                log.warning(
                    "the command's process %d was not reaped within %.0f s; its exit status "
                    "is unknown and the call ends without it",
                    proc.pid,
                    REAP_BOUND_S,
                )
        return proc.returncode

    def _reaped(self) -> bool:
        pid, status, rusage = os.wait4(self.proc.pid, os.WNOHANG)
        if pid:
            self.proc.returncode = os.waitstatus_to_exitcode(status)
            self._rusage = rusage
        return bool(pid)


def _kill_without_group(proc: LaunchedProcess, plan: Plan, marker: str) -> None:
    # The namespace's first process may have left the process group, and dropping root
    # cancelled its parent-death signal, so it is also killed by pid. Its pidfd is taken while
    # unshare, its parent, still holds it unreaped: the pid cannot have been reused.
    first = _pidfds(children(proc.pid)) if plan.namespaced else []
    try:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        for pidfd in first:
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        # The kernel kills the rest of a PID namespace before its first process is gone.
        _wait_readable(first, time.monotonic() + REAP_BOUND_S)
    finally:
        for pidfd in first:
            os.close(pidfd)
    if plan.sweep_uid is not None:
        sweep_marked(marker, plan.sweep_uid)


def _exit_status(pid: int) -> int | None:
    """The exit status of zombie ``pid`` as ``subprocess`` gives it, or None if it still runs."""
    fields = stat_fields(pid)
    if not fields or fields[0] != b"Z" or len(fields) < 50:
        return None
    return os.waitstatus_to_exitcode(int(fields[49]))


def _pidfds(pids: list[int]) -> list[int]:
    pidfds = []
    for pid in pids:
        with contextlib.suppress(OSError):
            pidfds.append(os.pidfd_open(pid))
    return pidfds


def _wait_readable(fds: list[int], deadline: float) -> None:
    with selectors.PollSelector() as selector:
        for fd in fds:
            selector.register(fd, selectors.EVENT_READ)
        while selector.get_map():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for key, _ in selector.select(remaining):
                selector.unregister(key.fd)
