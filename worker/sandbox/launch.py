"""Starting a command inside its control groups, made ready before the call comes.

The first program of a call is a shell that writes itself into the call's groups and then waits
for its command line, which it becomes: the wrappers, the namespaces and every process the
command starts are in the groups from their first instruction, with nothing to move later. A
worker killed at any moment leaves a group to sweep, never a command outside one.

Joining a group takes the kernel's lock on every process's group membership, and the first to
take it after a pause waits for an RCU grace period (milliseconds on a busy machine). So each
worker process makes the next call's group, and starts the shell that joins it, once a call is
over: the wait falls between calls, not in them. The shell holds nothing else: it exits at once
should its worker process die before using it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shlex
import socket
import subprocess
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.sandbox.callgroup import CallGroup
from worker.sandbox.config import SAFE_PATH, SHELL, SandboxConfig, SandboxError
from worker.sandbox.plan import Plan

_MB = 1024 * 1024
#: Joins each group named before ``--`` (exiting with 125, saying which, if one cannot be
#: joined), then reads its command line from its standard input, a socket to the worker: the
#: number of lines, then the lines (``read`` takes a byte at a time, so what follows stays for
#: the namespace's init). Nothing to read (the worker died) ends it.
WAITING_SCRIPT = (
    'while [ "$1" != -- ]; do echo 0 >"$1" || exit 125; shift; done; '
    'read -r n || exit 0; c=; while [ "$n" -gt 0 ]; do IFS= read -r l; c="$c$l\n"; '
    'n=$((n-1)); done; eval "$c"'
)


@dataclass
class Launch:
    """A shell in a call's groups, waiting for the call's command line."""

    group: CallGroup
    proc: subprocess.Popen[bytes]
    #: The worker's end of the shell's standard input: the command line goes in, and with a
    #: PID namespace the init's word that the command started comes out (see ``plan``).
    channel: socket.socket
    namespaced: bool

    def start(self, argv: Sequence[str], cwd: Path, env: Mapping[str, str]) -> None:
        """Run ``argv`` in ``cwd`` with ``env``: the waiting shell becomes it."""
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        # Without an init the command reads nothing; with one, its init gives it /dev/null.
        stdin = "" if self.namespaced else " </dev/null"
        line = f"cd -- {shlex.quote(str(cwd))} && export {exports} && exec {shlex.join(argv)}"
        text = f"{line}{stdin}\n"
        self.channel.sendall(f"{text.count(chr(10))}\n{text}".encode())
        if not self.namespaced:
            self.channel.close()

    def abandon(self) -> None:
        """Never used: the shell finds nothing to read and exits; its group goes."""
        self.channel.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(5)
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.group.remove()


def launch(plan: Plan, config: SandboxConfig) -> Launch:
    """A new group for one call of ``config``, and a shell in it waiting for the command."""
    group = CallGroup.create(
        plan.cgroups,
        # The plan's own processes in the group do not count against the command.
        max_processes=config.max_processes + plan.machinery,
        memory_bytes=config.memory_mb * _MB,
    )
    channel, its_end = socket.socketpair()
    try:
        proc = subprocess.Popen(
            [SHELL, "-c", WAITING_SCRIPT, "toolq-join", *group.join_files, "--"],
            stdin=its_end.fileno(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd="/",
            env={"PATH": SAFE_PATH},
            start_new_session=True,  # also detaches from any terminal, so no TIOCSTI tricks
        )
    except OSError as exc:
        channel.close()
        group.remove()
        raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
    finally:
        its_end.close()
    return Launch(group, proc, channel, plan.namespaced)


#: Launches kept ready per plan and configuration. Two: calls that come back to back take the
#: older one, whose shell joined its groups long before, while the next one is still joining.
READY = 2


class Launcher:
    """Keeps launches ready per plan and configuration for this process's next calls."""

    def __init__(self) -> None:
        self._ready: dict[tuple[Plan, SandboxConfig], list[Launch]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._making: list[threading.Thread] = []

    def take(self, plan: Plan, config: SandboxConfig) -> Launch:
        """The oldest launch made ready for ``config``, or a new one."""
        with self._lock:
            self._forget_if_forked()
            ready = self._ready.get((plan, config), [])
            oldest = ready.pop(0) if ready else None
        if oldest is not None and oldest.proc.poll() is None:
            return oldest
        if oldest is not None:
            oldest.abandon()
        return launch(plan, config)

    def prepare(self, plan: Plan, config: SandboxConfig) -> None:
        """Make launches in the background until ``READY`` are ready for ``config``."""
        with self._lock:
            self._forget_if_forked()
            self._making = [t for t in self._making if t.is_alive()]
            wanted = READY - len(self._ready.get((plan, config), [])) - len(self._making)
            for _ in range(max(0, wanted)):
                making = threading.Thread(
                    target=self._prepare, args=(plan, config), name="toolq-launch", daemon=True
                )
                self._making.append(making)
                making.start()

    def release(self) -> None:
        """Let every launch kept ready go (their shells exit, their groups are removed)."""
        with self._lock:
            making = list(self._making)
        for thread in making:
            thread.join()
        with self._lock:
            ready, self._ready = [one for kept in self._ready.values() for one in kept], {}
        for unused in ready:
            unused.abandon()

    def _prepare(self, plan: Plan, config: SandboxConfig) -> None:
        try:
            made = launch(plan, config)
        except SandboxError:
            return  # the next call makes its own, and says what went wrong
        with self._lock:
            ready = self._ready.setdefault((plan, config), [])
            kept = len(ready) < READY and os.getpid() == self._pid
            if kept:
                ready.append(made)
        if not kept:
            made.abandon()

    def _forget_if_forked(self) -> None:
        # A forked child inherits the parent's launches, whose shells are not its children.
        if os.getpid() != self._pid:
            self._ready, self._making, self._pid = {}, [], os.getpid()


launcher = Launcher()
# A process that ends normally lets its ready shells go and removes their groups itself; one
# that is killed leaves them to exit by themselves and its groups to the sweep.
atexit.register(launcher.release)
