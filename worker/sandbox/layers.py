"""The isolation layers: their names, as ``describe_isolation`` and every result tell them, and
which of them this machine gives a command under a configuration (``plan_for``): the sandbox
user and the programs found, namespaces and control groups probed, and from them the plan
(``worker.sandbox.plan``) that puts the layers in place.
"""

from __future__ import annotations

import functools
import os
import pwd
import shutil
import signal
import stat
import subprocess

from worker.contract.wire import LAYER_RUN_UID
from worker.exceptions import SandboxError
from worker.sandbox.cgroup_layout import detect_layout
from worker.sandbox.config import SAFE_PATH, SHELL, SandboxConfig
from worker.sandbox.keyrings import session_keyrings_work
from worker.sandbox.pidfd import tells_exit_after_reaping
from worker.sandbox.plan import Plan
from worker.sandbox.start.shell_text import HIDE_SCRIPT
from worker.sandbox.volumes import volumes_unavailable

#: The layers a command can get, as ``describe_isolation`` and every result name them.
LAYER_PROCESS_GROUP = "process-group"
LAYER_CLEAN_ENV = "clean-environment"
LAYER_RLIMITS = "rlimits"
LAYER_NO_NEW_PRIVS = "no-new-privileges"
LAYER_PID_NS = "pid-namespace"
LAYER_NET_NS = "network-namespace"
LAYER_USER_NS = "user-namespace"
#: /tmp, /var/tmp, /dev/shm and /run are the call's own (empty file systems in its mount
#: namespace, gone with it): nothing written there outlives the call, and no host socket under
#: them can be reached.
LAYER_PRIVATE_TMP = "private-tmp"
#: Without a mount namespace: what the run's uid left in /tmp, /var/tmp and /dev/shm is removed
#: once the last call of the run on this host ends.
LAYER_TMP_CLEANED = "tmp-cleaned"
#: Each run's workspace is a file system of the quota's size (``worker.sandbox.volumes``).
LAYER_QUOTA_FS = "quota-fs"
#: SysV IPC (shared memory, semaphores, message queues) and POSIX message queues are the call's
#: own (an IPC namespace of its own): none of another call is seen, and what it makes, memory
#: included, goes with its last process.
LAYER_IPC_NS = "ipc-namespace"
#: Each call has a session keyring of its own, empty at its start and gone with it.
LAYER_SESSION_KEYRING = "session-keyring"
#: Before a run's uid serves another run, what the kernel keeps for it is reset (its keyrings,
#: SysV IPC, message queues, files in the host's shared folders, processes); a uid that cannot
#: be shown clean is kept aside (``worker.sandbox.uid_reset``).
LAYER_UID_RESET = "uid-reset"
#: No control group bounds a call's memory: each of its processes is bounded by the address
#: space rlimit alone, so several processes of one call together may hold more. (Its SysV shared
#: memory is still bounded as a whole, by its IPC namespace's limit, where it has one.)
LAYER_MEMORY_PER_PROCESS = "memory-per-process-only"
#: Without a PID namespace: the command's /proc is one of its own, mounted ``hidepid=invisible``
#: in a mount namespace of the call's: other uids' processes (other runs', the worker's) are
#: not there, their command lines and environments with them.
LAYER_HIDDEN_PROCESSES = "hidden-processes"

#: ``env``'s option that gives a command SIGINT and SIGQUIT back (not every ``env`` has it).
_SIGNALS_BACK = "--default-signal=INT,QUIT"
#: The signals a shell ignores in its background jobs, which a command gets back.
_RESTORED = (signal.SIGINT, signal.SIGQUIT)


def describe_isolation(config: SandboxConfig) -> list[str]:
    """The layers this machine gives commands under ``config``; raises ``SandboxError``."""
    return list(plan_for(config, os.geteuid()).layers)


@functools.lru_cache(maxsize=8)
def plan_for(config: SandboxConfig, euid: int) -> Plan:
    """The plan for ``config`` in a worker whose effective uid is ``euid``, made once per pair;
    raises ``SandboxError`` when the configuration cannot be met here."""
    as_root = euid == 0
    layers = [LAYER_PROCESS_GROUP, LAYER_CLEAN_ENV]
    drop_to: tuple[int, int] | None = None
    prlimit = setpriv = ""
    first = None if config.uid_range is None else config.uid_range.first
    per_run = as_root and first is not None
    if as_root:
        # With per-run uids every call names its own; the first of the range stands in for
        # launches made ahead, which never run a command as it.
        drop_to = (first, first) if first is not None else sandbox_ids(config.settings.user)
        prlimit = require_binary("prlimit", "set resource limits")
        setpriv = require_binary("setpriv", "drop to the command's user")
        user = LAYER_RUN_UID if per_run else f"user:{config.settings.user}"
        layers += [user, LAYER_NO_NEW_PRIVS, LAYER_RLIMITS]
    else:
        prlimit = shutil.which("prlimit", path=SAFE_PATH) or ""
        if prlimit:
            layers.append(LAYER_RLIMITS)
    namespace_argv: tuple[str, ...] = ()
    ipc_argv: tuple[str, ...] = ()
    if config.settings.isolation != "process":
        argv = _namespace_argv(as_root)
        failure = probe_failure(argv)
        if failure is None:
            namespace_argv = argv
            layers += [LAYER_PID_NS, LAYER_NET_NS, LAYER_IPC_NS]
            layers += [] if as_root else [LAYER_USER_NS]
        elif config.settings.isolation == "namespaces":
            raise SandboxError(
                "namespace isolation was requested (sandbox_isolation='namespaces') but this "
                f"machine does not allow it: {failure}"
            )
    hide_argv: tuple[str, ...] = ()
    if per_run and not namespace_argv:
        argv = _hide_argv()
        if probe_failure(argv) is None:  # a kernel before 5.8 shares one proc's options
            hide_argv = argv
            layers.append(LAYER_HIDDEN_PROCESSES)
    if as_root and not namespace_argv and probe_failure(_ipc_argv()) is None:
        # Without the other namespaces, still the call's own SysV IPC and message queues: made
        # with the mount namespace that hides processes, where there is one (a program less).
        if hide_argv:
            hide_argv = _hide_argv(ipc=True)
        else:
            ipc_argv = _ipc_argv()
        layers.append(LAYER_IPC_NS)
    if session_keyrings_work():
        layers.append(LAYER_SESSION_KEYRING)
    env_binary = shutil.which("env", path=SAFE_PATH) or "/usr/bin/env"
    guard = shutil.which("setpriv", path=SAFE_PATH) or ""
    cgroups = detect_layout(config.settings.cgroup, str(config.settings.cgroup_root))
    if not cgroups.hierarchies and config.settings.cgroup in ("v1", "v2"):
        reasons = "; ".join(sorted({why for _, why in cgroups.missing}))
        raise SandboxError(
            f"cgroup {config.settings.cgroup} was requested "
            f"(TOOLQ_SANDBOX_CGROUP={config.settings.cgroup}) but this "
            f"machine does not give it: {reasons}"
        )
    layers += cgroups.layers
    if cgroups.doing("memory") is None and LAYER_RLIMITS in layers:
        layers.append(LAYER_MEMORY_PER_PROCESS)
    collected = bool(namespace_argv) or cgroups.doing("kill") is not None
    collected_by_init = bool(namespace_argv) and bool(cgroups.hierarchies)
    # An init that reaps its command at once (the spawner's, bash) needs the kernel to tell
    # the command's exit status through a pidfd.
    exit_told = collected_by_init and tells_exit_after_reaping()
    spawned = exit_told and as_root
    if per_run:
        layers.append(LAYER_PRIVATE_TMP if namespace_argv else LAYER_TMP_CLEANED)
        layers.append(LAYER_UID_RESET)
        if config.volume_bytes and volumes_unavailable() is None:
            layers.append(LAYER_QUOTA_FS)
    # A shell cannot give its jobs back a signal ignored when it started: where this process
    # ignores SIGINT or SIGQUIT, the dash init and ``env --default-signal`` do.
    bash_init = exit_told and not spawned and not signals_ignored_here()
    bash = shutil.which("bash", path=SAFE_PATH) if bash_init else None
    init_shell = bash or SHELL
    return Plan(
        layers=tuple(layers),
        namespace_argv=namespace_argv,
        drop_to=drop_to,
        prlimit=prlimit,
        setpriv=setpriv,
        guard=guard,
        env_binary=env_binary,
        sweep_uid=None if collected else (drop_to[0] if drop_to else os.getuid()),
        cgroups=cgroups,
        restores_signals=collected_by_init
        and (spawned or init_shell != SHELL or probe_failure((env_binary, _SIGNALS_BACK)) is None),
        ready_in=_ready_in(config.workspace_root, drop_to)
        if collected_by_init and not per_run
        else None,
        init_shell=init_shell,
        spawned=spawned,
        per_run=per_run,
        ipc_argv=ipc_argv,
        hide_argv=hide_argv,
    )


def _namespace_argv(as_root: bool) -> tuple[str, ...]:
    unshare = shutil.which("unshare", path=SAFE_PATH) or "unshare"
    user = () if as_root else ("--user", "--map-root-user")
    return (
        unshare, *user, "--pid", "--fork", "--kill-child", "--mount-proc", "--net", "--ipc", "--"
    )  # fmt: skip


def _ipc_argv() -> tuple[str, ...]:
    return (shutil.which("unshare", path=SAFE_PATH) or "unshare", "--ipc", "--")


def _hide_argv(ipc: bool = False) -> tuple[str, ...]:
    unshare = shutil.which("unshare", path=SAFE_PATH) or "unshare"
    mount = shutil.which("mount", path=SAFE_PATH) or "mount"
    # Slave: the host's mounts and unmounts (a run's volume) still reach the call's namespace.
    ipc_too = ("--ipc",) if ipc else ()
    mounts = (unshare, "--mount", *ipc_too, "--propagation", "slave", "--")
    return (*mounts, SHELL, "-c", HIDE_SCRIPT, "toolq-hide", mount)


@functools.lru_cache(maxsize=8)
def probe_failure(argv: tuple[str, ...]) -> str | None:
    """Why ``argv`` cannot run a program here (making namespaces, or with ``env`` giving it
    SIGINT and SIGQUIT back), or None when it can; probed once."""
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
        return reason or f"{os.path.basename(argv[0])} exited with code {probe.returncode}"
    return None


def _ready_in(workspace_root: str | None, drop_to: tuple[int, int] | None) -> str | None:
    """``workspace_root`` when the sandbox user may pass through it to a run's folder."""
    if workspace_root is None or drop_to is None:
        return None
    try:
        info = os.stat(workspace_root)
    except OSError:
        return None
    uid, gid = drop_to
    search = (
        stat.S_IXUSR if info.st_uid == uid else stat.S_IXGRP if info.st_gid == gid else stat.S_IXOTH
    )
    return workspace_root if info.st_mode & search else None


def signals_ignored_here() -> bool:
    """This process ignores SIGINT or SIGQUIT (as a program started in the background of a
    script does), and so would every process it starts unless one gives them back."""
    return any(signal.getsignal(number) is signal.SIG_IGN for number in _RESTORED)


def sandbox_ids(user: str) -> tuple[int, int]:
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SandboxError(
            f"the sandbox user {user!r} does not exist; create it or set TOOLQ_SANDBOX_USER"
        ) from None
    if entry.pw_uid == 0:
        raise SandboxError(f"the sandbox user {user!r} is root; choose an unprivileged user")
    return entry.pw_uid, entry.pw_gid


def require_binary(name: str, purpose: str) -> str:
    found = shutil.which(name, path=SAFE_PATH)
    if found is None:
        raise SandboxError(
            f"{name} (util-linux) is needed to {purpose} when the worker runs as root"
        )
    return found
