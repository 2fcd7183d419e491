"""The isolation plan: which layers this machine gives a command, and the command line that
puts them in place (the limits, the namespaces, the user to drop to, the environment)."""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from worker.sandbox.config import MARKER_VARIABLE, SAFE_PATH, SHELL, SandboxConfig, SandboxError

#: The layers a command can get, as ``describe_isolation`` and every result name them.
LAYER_PROCESS_GROUP = "process-group"
LAYER_CLEAN_ENV = "clean-environment"
LAYER_RLIMITS = "rlimits"
LAYER_NO_NEW_PRIVS = "no-new-privileges"
LAYER_PID_NS = "pid-namespace"
LAYER_NET_NS = "network-namespace"
LAYER_USER_NS = "user-namespace"


def describe_isolation(config: SandboxConfig) -> list[str]:
    """The layers this machine gives commands under ``config``; raises ``SandboxError``."""
    return list(plan_for(config, os.geteuid()).layers)


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
    #: uid whose processes may carry the marker; None when a PID namespace collects leftovers.
    sweep_uid: int | None

    @property
    def namespaced(self) -> bool:
        return bool(self.namespace_argv)

    @property
    def wrapped(self) -> bool:
        return self.drop_to is not None or self.namespaced or bool(self.prlimit or self.guard)

    def command_line(
        self,
        command: str | Sequence[str],
        base_env: dict[str, str],
        env: Mapping[str, str],
        marker: str,
        timeout_ms: int,
        config: SandboxConfig,
    ) -> tuple[list[str], dict[str, str]]:
        """The argv to start and the environment it starts with."""
        if marker:
            base_env = {**base_env, MARKER_VARIABLE: marker}
        requested = {k: v for k, v in env.items() if k != MARKER_VARIABLE}
        shell = [SHELL, "-c", command] if isinstance(command, str) else list(command)
        if not self.wrapped:
            return shell, {**base_env, **requested}
        argv: list[str] = []
        if self.guard:
            argv += [self.guard, "--pdeathsig", "KILL", "--"]
        if self.prlimit:
            # SIGXCPU at the soft limit tells what happened; SIGKILL a second later is sure.
            cpu_s = -(-timeout_ms // 1000) + 1
            mb = 1024 * 1024
            argv += [
                self.prlimit,
                f"--cpu={cpu_s}:{cpu_s + 1}",
                f"--as={config.memory_mb * mb}",
                f"--nproc={config.max_processes}",
                f"--fsize={config.file_size_mb * mb}",
                "--",
            ]
        argv += self.namespace_argv
        if self.drop_to is not None:
            uid, gid = self.drop_to
            argv += [self.setpriv, f"--reuid={uid}", f"--regid={gid}", "--clear-groups"]
            # Changing user clears the parent-death signal (unshare's --kill-child, or the
            # guard's): "keep" sets it again, or a killed worker would orphan the command.
            argv += ["--no-new-privs", "--pdeathsig", "keep", "--"]
        # The wrappers run (some as root) before the limits and namespaces hold: a variable such
        # as LD_PRELOAD must reach only the shell, so ``env`` adds the caller's at the last step.
        if requested:
            argv += [self.env_binary, "--", *(f"{k}={v}" for k, v in requested.items())]
        return argv + shell, base_env


@functools.lru_cache(maxsize=8)
def plan_for(config: SandboxConfig, euid: int) -> Plan:
    """The plan for ``config`` in a worker whose effective uid is ``euid``, made once per pair;
    raises ``SandboxError`` when the configuration cannot be met here."""
    as_root = euid == 0
    layers = [LAYER_PROCESS_GROUP, LAYER_CLEAN_ENV]
    drop_to: tuple[int, int] | None = None
    prlimit = setpriv = ""
    if as_root:
        drop_to = _sandbox_ids(config.user)
        prlimit = _require_binary("prlimit", "set resource limits")
        setpriv = _require_binary("setpriv", f"drop to user {config.user!r}")
        layers += [f"user:{config.user}", LAYER_NO_NEW_PRIVS, LAYER_RLIMITS]
    else:
        prlimit = shutil.which("prlimit", path=SAFE_PATH) or ""
        if prlimit:
            layers.append(LAYER_RLIMITS)
    namespace_argv: tuple[str, ...] = ()
    if config.isolation != "process":
        argv = _namespace_argv(as_root)
        failure = namespace_failure(argv)
        if failure is None:
            namespace_argv = argv
            layers += [LAYER_PID_NS, LAYER_NET_NS] + ([] if as_root else [LAYER_USER_NS])
        elif config.isolation == "namespaces":
            raise SandboxError(
                "namespace isolation was requested (sandbox_isolation='namespaces') but this "
                f"machine does not allow it: {failure}"
            )
    env_binary = shutil.which("env", path=SAFE_PATH) or "/usr/bin/env"
    guard = shutil.which("setpriv", path=SAFE_PATH) or ""
    return Plan(
        layers=tuple(layers),
        namespace_argv=namespace_argv,
        drop_to=drop_to,
        prlimit=prlimit,
        setpriv=setpriv,
        guard=guard,
        env_binary=env_binary,
        sweep_uid=None if namespace_argv else (drop_to[0] if drop_to else os.getuid()),
    )


def _sandbox_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(
            f"the sandbox user {user!r} does not exist; create it or set TOOLQ_SANDBOX_USER"
        ) from None
    if entry.pw_uid == 0:
        raise SandboxError(f"the sandbox user {user!r} is root; choose an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def _require_binary(name: str, purpose: str) -> str:
    found = shutil.which(name, path=SAFE_PATH)
    if found is None:
        raise SandboxError(
            f"{name} (util-linux) is needed to {purpose} when the worker runs as root"
        )
    return found


def _namespace_argv(as_root: bool) -> tuple[str, ...]:
    unshare = shutil.which("unshare", path=SAFE_PATH) or "unshare"
    user = () if as_root else ("--user", "--map-root-user")
    return (unshare, *user, "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--")


@functools.lru_cache(maxsize=4)
def namespace_failure(argv: tuple[str, ...]) -> str | None:
    """Why ``argv`` cannot make namespaces here, or None when it can; probed once."""
    try:
        probe = subprocess.run(
            [*argv, "/bin/true"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            env={"PATH": SAFE_PATH},
            timeout=10,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if probe.returncode != 0:
        reason = probe.stderr.decode("utf-8", "replace").strip()
        return reason or f"unshare exited with code {probe.returncode}"
    return None
