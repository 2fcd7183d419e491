"""The isolation plan: how a command gets the layers this machine gives it (which of them, and
the programs they need, are found by ``worker.sandbox.layers``): the command line that puts
them in place (the limits, the namespaces, the user to drop to, the environment), the line a
ready init runs, and the plan as one call, one run or one folder narrows it.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.exceptions import SandboxError
from worker.sandbox.cgroup_layout import CgroupLayout
from worker.sandbox.config import INPUT_FOLDER, MARKER_VARIABLE, SHELL, SandboxConfig
from worker.sandbox.start.shell_text import (
    BIND_FILES_SCRIPT,
    FORK_AHEAD,
    PRIVATE_SCRIPT,
    READ_AND_RUN,
    SHELL_AHEAD,
    SHELL_NAME,
    ulimit_flags,
)

#: The folders a call's mount namespace covers with empty file systems of its own.
PRIVATE_FOLDERS = ("/tmp", "/var/tmp", "/dev/shm", "/run")

#: The limits that depend on the call (its time limit); the others depend on the configuration.
PER_CALL_LIMITS = frozenset({"cpu"})


@dataclass(frozen=True, slots=True)
class Plan:
    """How commands run here under one configuration: the layers they get, and the programs
    that put those layers in place."""

    layers: tuple[str, ...]
    namespace_argv: tuple[str, ...]
    #: uid and gid to drop to, with the path of setpriv, when the worker is root.
    drop_to: tuple[int, int] | None
    #: prlimit's path: lowering one's own limits needs no privilege, so any worker applies them.
    prlimit: str
    setpriv: str
    #: setpriv's path, to give the command a parent-death signal: a worker process killed
    #: mid-call takes its command (and, through unshare, the whole namespace) with it.
    guard: str
    env_binary: str
    #: uid whose processes may carry the marker; None when a PID namespace or a control group
    #: collects leftovers.
    sweep_uid: int | None
    #: The control groups each command gets (none: the rlimits hold alone).
    cgroups: CgroupLayout
    #: ``env --default-signal`` works: a command started in the background of the namespace's
    #: first process gets SIGINT and SIGQUIT back, which a shell ignores for background jobs.
    restores_signals: bool = False
    #: Where a ready init waits, already the sandbox user's (see ``SandboxConfig``); None: the
    #: init stays root and each call drops to the sandbox user.
    ready_in: str | None = None
    #: The init's shell. bash where the kernel tells a reaped command's exit status through a
    #: pidfd (bash reaps its children at once; dash leaves them for the worker to read): bash
    #: gives its background command SIGINT and SIGQUIT back itself, so a call starts one
    #: program, not ``env`` and then the command.
    init_shell: str = SHELL
    #: A root worker's launches come from its spawner
    #: (``worker.sandbox.start.spawner_process``): system calls in a small process of its own
    #: instead of five programs per launch. Its init forks ahead like bash's; the process forked
    #: is the call's shell already (``shell_ahead``), or sets the call up itself (folder, limits,
    #: variables, the drop) and execs the command.
    spawned: bool = False
    #: Each call names the uid and gid it runs as (its run's); the init drops ahead only in
    #: a launch made for a known run (``for_run``).
    per_run: bool = False
    #: What a launch made for a known run binds, (source, target) in order: the run's own /tmp,
    #: its workspace, the calls' inputs (``private_binds``).
    keep: tuple[tuple[str, str], ...] = ()
    #: Without the other namespaces: the IPC namespace of the call's own
    #: (``layers.LAYER_IPC_NS``).
    ipc_argv: tuple[str, ...] = ()
    #: Without namespaces: the mount namespace and the /proc that hide other uids' processes
    #: (``layers.LAYER_HIDDEN_PROCESSES``), put in place as root before the drop.
    hide_argv: tuple[str, ...] = ()

    @property
    def namespaced(self) -> bool:
        return bool(self.namespace_argv)

    @property
    def grouped(self) -> bool:
        return bool(self.cgroups.hierarchies)

    @property
    def has_init(self) -> bool:
        """The namespace's first process is an init (``READ_AND_RUN``), not the command."""
        return self.grouped and self.namespaced

    @property
    def machinery(self) -> int:
        """Processes of the plan's own in a command's control group: unshare and the init."""
        return 2 if self.has_init else 0

    @property
    def forks_ahead(self) -> bool:
        """The init has forked the command's process before the call (``FORK_AHEAD``, or the
        spawner's)."""
        return self.has_init and (self.spawned or self.init_shell != SHELL)

    @property
    def init_drops(self) -> bool:
        """The ready init has already dropped to the sandbox user: the call does not."""
        return self.has_init and self.ready_in is not None

    @property
    def ready_argv(self) -> tuple[str, ...]:
        """With an init: what a launch starts before its call comes, in the call's groups: the
        guard, the namespaces, with ``ready_in`` the drop to the sandbox user, and the init
        waiting for its line."""
        guard = (self.guard, "--pdeathsig", "KILL", "--") if self.guard else ()
        drop = self._drop() if self.init_drops else []
        # bash reads ~/.bashrc when its input is a socket (as under sshd) unless told not to.
        init = (
            (self.init_shell, "--norc", "--noprofile", "-c", FORK_AHEAD, "toolq-init")
            if self.forks_ahead
            else (self.init_shell, "-c", READ_AND_RUN, "toolq-init")
        )
        return (*guard, *self.namespace_argv, *drop, *init)

    def for_identity(self, identity: tuple[int, int] | None) -> Plan:
        """This plan for a call that runs as ``identity`` (its run's uid and gid): the drop,
        and without a namespace or group the sweep, are that uid's. Launches are made for the
        plan itself: with per-run uids they wait as root and drop when the call comes."""
        if not self.per_run:
            return self
        if identity is None:
            raise SandboxError("a command of a run needs the run's uid: none was given")
        sweep = None if self.sweep_uid is None else identity[0]
        return dataclasses.replace(self, drop_to=identity, sweep_uid=sweep)

    def for_run(
        self,
        identity: tuple[int, int] | None,
        home: str,
        run_tmp: str | None,
        names: tuple[tuple[str, str], ...] = (),
    ) -> Plan | None:
        """The plan of launches made ahead for one run (``identity``, working in ``home``): the
        init has its folders bound and has dropped to its uid, and the process it forked is the
        call's shell already, as with runs sharing one uid. None where launches are not made
        ahead that way (no spawner, or no per-run uids)."""
        if not (self.per_run and self.spawned) or identity is None:
            return None
        binds = private_binds(home, run_tmp, str(INPUT_FOLDER), names)
        return dataclasses.replace(
            self, drop_to=identity, ready_in=os.path.dirname(home), keep=binds
        )

    def private_folders(self, config: SandboxConfig) -> dict[str, object] | None:
        """What a spawned launch's namespace covers with empty file systems of its own, and
        binds back (``spawner_process._cover``): with per-run uids, /tmp and the like are the
        call's."""
        if not (self.per_run and self.spawned):
            return None
        return {
            "folders": list(PRIVATE_FOLDERS),
            "bind": [list(pair) for pair in self.keep],
            "size_bytes": config.settings.memory_mb * 1024 * 1024,
        }

    def for_folder(self, cwd: str) -> Plan:
        """This plan for a call in ``cwd``: one whose init stays root when ``cwd`` is not below
        ``ready_in`` (the sandbox user may not reach it by its path)."""
        if self.ready_in is None or _is_within(cwd, self.ready_in):
            return self
        return dataclasses.replace(self, ready_in=None)

    def init_line(
        self, argv: Sequence[str], cwd: str, exports: str, ulimits: Sequence[str], started_in: str
    ) -> str:
        """The line a ready init (started in ``started_in``) runs for a call: the command in
        the background under the call's limits (its input /dev/null, as for any background job
        of a shell), word that it started on its standard input (a socket to the worker), and
        the wait. A namespace dies with its first process, so the init waits while the worker
        reads the command's exit status from the zombie (a signal told apart from a status
        above 128) and counts what it left running; when the worker closes the socket, the init
        reaps the command and exits with its status, and the namespace ends the rest. On a
        timeout the worker kills the whole group instead.

        An init that forked ahead (``FORK_AHEAD``) has nothing left to start: the process it
        forked runs the line, and the worker learns the command's exit status from its pidfd.

        An init that is already the sandbox user enters the call's folder by its path from
        where it waits: the folders above may be closed to that user."""
        where = self.folder_from(cwd, started_in)
        limits = "".join(f"ulimit {limit} || exit 126; " for limit in ulimits)
        enter = f"cd -P -- {shlex.quote(where)} || exit 126; "
        if self.forks_ahead:
            return f"{enter}{limits}export {exports}; exec {shlex.join(argv)} 3<&-"
        return (
            f"{enter}{{ {limits}export {exports}; exec {shlex.join(argv)}; }} & "
            "echo >&0; read _; wait $!"
        )

    @property
    def shell_ahead(self) -> tuple[str, ...] | None:
        """A spawned launch whose init is already the sandbox user: the argv its forked process
        becomes before the call, the shell that will run the command (``SHELL_AHEAD``)."""
        if self.spawned and self.init_drops:
            return (SHELL, "-c", SHELL_AHEAD, SHELL)
        return None

    def folder_from(self, cwd: str, started_in: str) -> str:
        """``cwd`` as a ready init enters it: by its path from where it waits when it is
        already the sandbox user (the folders above may be closed to that user)."""
        if self.init_drops and _is_within(cwd, started_in):
            return os.path.join(".", os.path.relpath(cwd, started_in))
        return cwd

    @property
    def wrapped(self) -> bool:
        return bool(self.drop_to or self.namespaced or self.grouped or self.prlimit or self.guard)

    def command_line(
        self,
        command: str | Sequence[str],
        base_env: dict[str, str],
        env: Mapping[str, str],
        marker: str,
        timeout_ms: int,
        config: SandboxConfig,
        keep: Sequence[tuple[str, str]] = (),
    ) -> tuple[list[str], dict[str, str]]:
        """The argv to start and the environment it starts with (with control groups, the
        shell of ``worker.sandbox.start.launch`` starts it from inside them). ``keep``: what a call
        with private folders binds, (source, target) in order (``private_binds``)."""
        if marker:
            base_env = {**base_env, MARKER_VARIABLE: marker}
        requested = {k: v for k, v in env.items() if k != MARKER_VARIABLE}
        shell = [SHELL, "-c", command] if isinstance(command, str) else list(command)
        if not self.wrapped or (self.has_init and self.spawned):
            # A spawned command's process drops to the user and sets the variables itself.
            return shell, {**base_env, **requested}
        argv: list[str] = []
        pairs = [path for pair in keep for path in pair]
        # The shell ignores SIGINT and SIGQUIT in the background jobs of a namespace's init
        # and cannot give them back: ``env`` does, at the last step.
        restore = []
        if self.has_init and self.restores_signals and not self.forks_ahead:
            restore = ["--default-signal=INT,QUIT"]
        # With an init, the guard and the namespaces were put in place before the call came
        # (``ready_argv``), and the init sets the limits (``init_line``): it starts what
        # follows, from an init that is already the sandbox user the shell alone.
        if not self.has_init:
            if self.guard:
                argv += [self.guard, "--pdeathsig", "KILL", "--"]
            if self.prlimit:
                limits = self.limits(timeout_ms, config).items()
                flags = [f"--{name}={soft}:{hard}" for name, (soft, hard) in limits]
                argv += [self.prlimit, *flags, "--"]
            argv += self.namespace_argv
            argv += self.ipc_argv
            argv += self.hide_argv
            if self.hide_argv and keep:
                # Still root, in the mount namespace that hides processes: the run's uid's name.
                argv += [SHELL, "-c", BIND_FILES_SCRIPT, "toolq-names", self.hide_argv[-1]]
                argv += [*pairs, "--"]
        if self.per_run and self.namespaced:
            # Still root, in the call's mount namespace: its own /tmp and the like.
            size = str(config.settings.memory_mb * 1024 * 1024)
            argv += [SHELL, "-c", PRIVATE_SCRIPT, "toolq-private", size, *pairs, "--"]
        if not self.init_drops:
            argv += self._drop()
        # The wrappers run (some as root) before the limits and namespaces hold: a variable such
        # as LD_PRELOAD must reach only the shell, so the caller's are added at the last step:
        # by an init that is already the sandbox user, in the line it runs (names a shell can
        # export), else by ``env``.
        if self.init_drops and all(SHELL_NAME.fullmatch(name) for name in requested):
            base_env, requested = {**base_env, **requested}, {}
        if requested or restore:
            argv += [self.env_binary, *restore, "--", *(f"{k}={v}" for k, v in requested.items())]
        return argv + shell, base_env

    def _drop(self) -> list[str]:
        if self.drop_to is None:
            return []
        uid, gid = self.drop_to
        # Changing user clears the parent-death signal (unshare's --kill-child, or the
        # guard's): "keep" sets it again, or a killed worker would orphan the command.
        return [
            self.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups",
            "--no-new-privs", "--pdeathsig", "keep", "--",
        ]  # fmt: skip

    def limits(self, timeout_ms: int, config: SandboxConfig) -> dict[str, tuple[int, int]]:
        """The rlimits of a call, soft and hard: CPU seconds, file bytes, and where no control
        group does, address space bytes and processes."""
        if not self.prlimit:
            return {}
        # SIGXCPU at the soft limit tells what happened; SIGKILL a second later is sure.
        cpu_s = -(-timeout_ms // 1000) + 1
        mb = 1024 * 1024
        limits = {"cpu": (cpu_s, cpu_s + 1), "fsize": (config.settings.file_size_mb * mb,) * 2}
        # A control group limits by what a command holds, not what it reserves, and per call,
        # not per user: the rlimits stand in only where no group does.
        if self.cgroups.doing("memory") is None:
            limits["as"] = (config.settings.memory_mb * mb,) * 2
        if self.cgroups.doing("pids") is None:
            limits["nproc"] = (config.settings.max_processes,) * 2
        return limits

    def limits_ahead(self, config: SandboxConfig) -> dict[str, tuple[int, int]]:
        """The limits that do not depend on the call, which a shell started ahead has from its
        start (all but ``PER_CALL_LIMITS``)."""
        limits = self.limits(0, config)
        return {name: limits[name] for name in limits if name not in PER_CALL_LIMITS}

    def ulimits(self, limits: Mapping[str, tuple[int, int]]) -> list[str]:
        """``limits`` as this plan's init shell's ``ulimit`` sets them."""
        return ulimit_flags(limits, bash=self.init_shell != SHELL)


def private_binds(
    home: str,
    run_tmp: str | None,
    input_folder: str | None,
    names: tuple[tuple[str, str], ...] = (),
) -> tuple[tuple[str, str], ...]:
    """What a call of a run binds in its mount namespace, (source, target) in order: the run's
    own folder as /tmp and /var/tmp (what a command leaves there is there for the run's next
    call, and gone with its workspace), then its workspace and its input's folder where they
    were (they may lie below /tmp), then the files that name its uid (``names``)."""
    binds: list[tuple[str, str]] = []
    if run_tmp is not None:
        binds += [(run_tmp, "/tmp"), (run_tmp, "/var/tmp")]
    binds.append((home, home))
    if input_folder is not None:
        binds.append((input_folder, input_folder))
    return (*binds, *names)


def _is_within(path: str, folder: str) -> bool:
    return os.path.commonpath([path, folder]) == folder
