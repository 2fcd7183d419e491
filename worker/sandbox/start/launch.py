"""Starting a command inside its control groups, made ready before the call comes.

The first program of a call is a shell that writes itself into the call's groups. With a PID
namespace it then becomes the guard and ``unshare``, whose init waits for the call's command line
(``Plan.ready_argv``); a bash init has already forked the process that becomes the command, and
says so (``Launch.confirm``). Without a namespace, the shell waits for the command line itself
and becomes it. Either way the wrappers, the namespaces and every process the command starts are
in the groups from their first instruction, with nothing to move later. A worker killed at any
moment leaves a group to sweep, never a command outside one.

Joining a group takes the kernel's lock on every process's group membership, and the first to
take it after a pause waits for an RCU grace period (milliseconds on a busy machine); making the
namespaces takes milliseconds too. So each worker process makes the next call's launch once a
call is over: the waits fall between calls, not in them. A launch holds nothing of a call's: it
exits at once should its worker process die before using it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from worker.exceptions import SandboxError
from worker.sandbox.bounded import wait_at_most
from worker.sandbox.call_cgroup import CallGroup
from worker.sandbox.config import REAP_BOUND_S, SAFE_PATH, SHELL, SandboxConfig
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.keyrings import own_session_keyring
from worker.sandbox.layers import LAYER_SESSION_KEYRING
from worker.sandbox.pidfd import has_exited
from worker.sandbox.plan import PER_CALL_LIMITS, Plan
from worker.sandbox.start.proc_lookup import ForkedCommand, find_forked
from worker.sandbox.start.shell_text import READ_AND_RUN, numbered, shell_ahead_line
from worker.sandbox.start.spawner_client import LaunchedProcess, SpawnedProcess, spawner
from worker.sandbox.start.spawner_process import OOM_FIRST

log = logging.getLogger(__name__)

_MB = 1024 * 1024
#: Joins each group named before ``--`` (exiting with 125, saying which, if one cannot be
#: joined), then runs what follows ``--`` (an init made ready with its namespaces) or, with
#: nothing after it, reads its command line from its standard input, a socket to the worker, and
#: becomes it.
WAITING_SCRIPT = (
    'while [ "$1" != -- ]; do echo 0 >"$1" || exit 125; shift; done; shift; '
    f'if [ "$#" -gt 0 ]; then exec "$@"; fi; {READ_AND_RUN}'
)


@dataclass
class Launch:
    """A call's groups with a process in them waiting for the call's command line: a shell,
    or with a PID namespace the namespace's init (``Plan.ready_argv``)."""

    plan: Plan
    group: CallGroup
    proc: LaunchedProcess
    #: The worker's end of the shell's standard input: the command line goes in, and with a
    #: PID namespace the init's word that the command started comes out (see ``plan``).
    channel: socket.socket
    #: The folder its first process started in.
    started_in: str
    #: With an init that forks ahead: the process that becomes the command, once the init
    #: said it is there (``confirm``).
    forked: ForkedCommand | None = None
    confirmed: bool = False
    #: Made for one run (``Plan.for_run``): the (device, inode) of the workspace it bound, which
    #: a call checks is still the run's (a workspace removed and made again is another).
    bound: tuple[int, int] | None = None

    def confirm(self, deadline: float) -> None:
        """With an init that forks ahead, wait for its word that it is ready, and find the
        process it forked. Without it (the init failed, or is late) the call still runs, and
        ends the slow way: its group killed, the launch's exit status told."""
        if self.confirmed or not self.plan.forks_ahead:
            return
        self.confirmed = True
        with contextlib.suppress(OSError):
            self.channel.settimeout(max(0.0, deadline - time.monotonic()))
            try:
                ready = self.channel.recv(1)
            finally:
                self.channel.settimeout(None)
            if ready:
                self.forked = find_forked(self.proc.pid)

    @property
    def waiting(self) -> bool:
        """Its process forked ahead, which takes the call, is still there (its init outlives it,
        and would swallow the call's line). Without one, the first process is what waits."""
        if not self.plan.forks_ahead:
            return self.proc.poll() is None
        return self.forked is not None and not has_exited(self.forked.pidfd)

    def close(self) -> None:
        """The call is over: its channel and its pidfds go."""
        self.channel.close()
        if self.forked is not None:
            os.close(self.forked.pidfd)
            self.forked = None
        if isinstance(self.proc, SpawnedProcess):
            self.proc.close()

    def start(
        self,
        argv: Sequence[str],
        cwd: Path,
        env: Mapping[str, str],
        limits: Mapping[str, tuple[int, int]],
        *,
        drop: tuple[int, int] | None = None,
        bind: Sequence[tuple[str, str]] = (),
        attach: tuple[int, str] | None = None,
    ) -> None:
        """Run ``argv`` in ``cwd`` with ``env`` under ``limits`` (``Plan.limits``): the waiting
        shell becomes it; with a PID namespace the init starts it, or the process the spawner
        forked ahead runs it (as the shell started ahead, or by exec). ``drop``: the uid and gid
        the spawner's process becomes (default the plan's); ``bind``: the folders it binds back
        below the launch's private ones (``spawner_process._bind``); ``attach``: a detached
        mount and where the process attaches it (the run's volume, ``volumes.detached_copy``)."""
        if self.plan.spawned and self.forked is not None:
            # Made at the lowest priority, between calls; the command runs at the normal one.
            with contextlib.suppress(OSError):
                os.setpriority(os.PRIO_PROCESS, self.forked.pid, 0)
        if self.plan.shell_ahead is not None:
            where = self.plan.folder_from(str(cwd), self.started_in)
            per_call = {name: limits[name] for name in limits if name in PER_CALL_LIMITS}
            ulimits = self.plan.ulimits(per_call)
            text = shell_ahead_line(argv, where, env, ulimits, self.plan.env_binary)
            self.channel.sendall(numbered(text))
            return
        if self.plan.spawned and self.plan.has_init:
            # The call as the spawner's forked process reads it: one line of JSON.
            spawned_call = {
                "argv": list(argv),
                "cwd": self.plan.folder_from(str(cwd), self.started_in),
                "env": dict(env),
                "limits": dict(limits),
                "drop": None if self.plan.init_drops else (drop or self.plan.drop_to),
                "bind": [list(pair) for pair in bind],
                "attach": attach[1] if attach is not None else None,
            }
            call = json.dumps(spawned_call).encode() + b"\n"
            if attach is not None:
                # The descriptor travels with the line's first byte; the rest follows whole.
                socket.send_fds(self.channel, [call[:1]], [attach[0]])
                call = call[1:]
            self.channel.sendall(call)
            return
        exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in env.items())
        if self.plan.has_init:
            ulimits = self.plan.ulimits(limits)
            line = self.plan.init_line(argv, str(cwd), exports, ulimits, self.started_in)
        else:
            where = shlex.quote(str(cwd))
            # Without a mount namespace /tmp is shared: what a run writes there is its own.
            umask = "umask 077 && " if self.plan.per_run else ""
            line = f"cd -- {where} && {umask}export {exports} && exec {shlex.join(argv)} </dev/null"
        self.channel.sendall(numbered(line))
        if not self.plan.has_init:
            self.channel.close()

    def abandon(self) -> None:
        """Never used: the shell finds nothing to read and exits; its group goes."""
        self.channel.close()
        wait_at_most(self.proc, REAP_BOUND_S, "an unused launch")
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream is not None:
                stream.close()
        self.close()
        self.group.remove()


def launch(plan: Plan, config: SandboxConfig) -> Launch:
    """A new group for one call of ``config``, and in it a shell, or a namespace's init,
    waiting for the command."""
    group = CallGroup.create(
        plan.cgroups,
        worker=HostRegistry(config.host_state).worker_id(config.fleet()),
        # The plan's own processes in the group do not count against the command.
        max_processes=config.settings.max_processes + plan.machinery,
        memory_bytes=config.settings.memory_mb * _MB,
        cpu=config.settings.cpu,
    )
    ready = plan.ready_argv if plan.has_init else ()
    started_in = plan.ready_in if plan.ready_in and os.path.isdir(plan.ready_in) else "/"
    if plan.spawned and plan.has_init:
        drop = plan.drop_to if plan.init_drops else None
        try:
            spawned, socket_to_init = spawner.launch(
                group.join_files,
                drop,
                started_in,
                plan.shell_ahead,
                plan.limits_ahead(config),
                plan.private_folders(config),
            )
        except SandboxError:
            group.remove()
            raise
        bound = folder_id(_workspace_of(plan)) if plan.keep else None
        return Launch(plan, group, spawned, socket_to_init, started_in, bound=bound)
    channel, its_end = socket.socketpair()
    try:
        with session_keyring(plan):
            proc = subprocess.Popen(
                [SHELL, "-c", WAITING_SCRIPT, "toolq-join", *group.join_files, "--", *ready],
                stdin=its_end.fileno(),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=started_in,
                env={"PATH": SAFE_PATH},
                start_new_session=True,  # also detaches from any terminal, so no TIOCSTI tricks
            )
        dies_first(proc.pid)  # it waits for the command line: its command inherits this
    except SandboxError:
        channel.close()
        group.remove()
        raise
    except OSError as exc:
        channel.close()
        group.remove()
        raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
    finally:
        its_end.close()
    return Launch(plan, group, proc, channel, started_in)


@contextlib.contextmanager
def session_keyring(plan: Plan) -> Iterator[None]:
    """What this thread starts inside has a session keyring of its own; raises
    ``SandboxError`` where the plan promises one and none can be made."""
    with own_session_keyring() as failure:
        if failure is not None and LAYER_SESSION_KEYRING in plan.layers:
            raise SandboxError(f"the command cannot have a session keyring of its own: {failure}")
        yield


def dies_first(pid: int) -> None:
    """Where memory runs short for the worker and its calls together (a pod's limit, the
    host's), the kernel's OOM killer takes the process ``pid`` (a call's first) and what it
    starts before the worker. Raising the score needs no privilege."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text(str(OOM_FIRST))


def folder_id(path: str) -> tuple[int, int] | None:
    """The folder's identity (device, inode), None once it is gone: a folder removed and made
    again under the same name is another one."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def still_bound(made: Launch) -> bool:
    """A launch made for one run still shows that run's workspace as it is now."""
    return made.bound is None or (made.bound == folder_id(_workspace_of(made.plan)))


def _workspace_of(plan: Plan) -> str:
    """The workspace a plan made for one run binds: the first folder bound where it was."""
    return next(source for source, target in plan.keep if source == target)


def made_now(plan: Plan, config: SandboxConfig) -> Launch:
    """A launch made on the call's path, none being ready."""
    made = launch(plan, config)
    made.confirm(time.monotonic() + CONFIRM_BOUND_S)
    return made


#: How long a call waits for its init's word that it forked ahead: the launch was made during
#: earlier calls and is usually ready long before.
CONFIRM_BOUND_S = 10.0
