"""Running one shell command in isolation, with its output capped while it is read.

Layers, strongest last: the command runs in a session of its own with a minimal environment,
and everything it started is killed when it ends. When the worker is root it runs as an
unprivileged user under resource limits, without a way to gain privileges. Where the machine
allows it (see ``describe_isolation``), it gets private PID and network namespaces: nothing it
starts outlives it and it cannot reach the network or see other processes.
"""

from __future__ import annotations

import codecs
import contextlib
import functools
import os
import pwd
import selectors
import shutil
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Literal, get_args

if TYPE_CHECKING:
    from worker.settings import WorkerSettings

Isolation = Literal["auto", "namespaces", "process"]

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"
#: Marks every process of one command (when no PID namespace collects them) so that those
#: that left its session can still be found and killed.
MARKER_VARIABLE = "TOOLQ_SANDBOX_ID"

#: How long to keep reading once the command has ended and its leftovers were killed: their
#: pipes close at once, unless something escaped (possible only without a PID namespace).
DRAIN_BOUND_S = 0.5
#: How long killed processes may take to be gone before we stop waiting for them.
REAP_BOUND_S = 5.0
_READ_CHUNK = 65_536

LAYER_PROCESS_GROUP = "process-group"
LAYER_CLEAN_ENV = "clean-environment"
LAYER_RLIMITS = "rlimits"
LAYER_NO_NEW_PRIVS = "no-new-privileges"
LAYER_PID_NS = "pid-namespace"
LAYER_NET_NS = "network-namespace"
LAYER_USER_NS = "user-namespace"

#: What util-linux's unshare (2.38) prints, exiting with 1, when its child died of SIGKILL.
_UNSHARE_SAW_SIGKILL = b"unshare: sigprocmask unblock failed: Invalid argument\n"

_SIGNAL_HINTS = {
    signal.SIGXCPU: "CPU time limit reached",
    signal.SIGXFSZ: "file size limit reached",
    signal.SIGKILL: "out of memory or CPU time, or killed from outside",
    signal.SIGSEGV: "segmentation fault",
}


class SandboxError(RuntimeError):
    """The sandbox cannot run commands as configured; the message says why."""


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How commands are isolated and limited."""

    user: str = "nobody"
    isolation: Isolation = "auto"
    memory_mb: int = 1024
    max_processes: int = 256
    file_size_mb: int = 256
    output_cap_bytes: int = 51_200

    def __post_init__(self) -> None:
        if self.isolation not in get_args(Isolation):
            raise ValueError(
                f"sandbox isolation must be one of {', '.join(get_args(Isolation))}, "
                f"not {self.isolation!r}"
            )
        for field in ("memory_mb", "max_processes", "file_size_mb", "output_cap_bytes"):
            if getattr(self, field) <= 0:
                raise ValueError(f"sandbox {field} must be positive")

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> SandboxConfig:
        return cls(
            user=settings.sandbox_user,
            isolation=settings.sandbox_isolation,
            memory_mb=settings.sandbox_memory_mb,
            max_processes=settings.sandbox_max_processes,
            file_size_mb=settings.sandbox_file_size_mb,
            output_cap_bytes=settings.output_cap_bytes,
        )


@dataclass(frozen=True, slots=True)
class SandboxResult:
    """What a command produced; texts are capped and carry notices of what was cut or killed."""

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    duration_ms: int
    stdout_truncated: bool
    stderr_truncated: bool
    isolation: tuple[str, ...]


def describe_isolation(config: SandboxConfig) -> list[str]:
    """The layers this machine gives commands under ``config``; raises ``SandboxError``."""
    return list(_plan(config, os.geteuid()).layers)


def run_sandboxed(
    command: str,
    *,
    cwd: Path,
    home: Path,
    env: Mapping[str, str],
    timeout_ms: int,
    config: SandboxConfig,
) -> SandboxResult:
    """Run ``/bin/sh -c command`` in ``cwd``, kill everything it started, report the outcome."""
    plan = _plan(config, os.geteuid())
    # The marker names the worker process too, so a later sweep can tell an orphan (its worker
    # was killed mid-call) from a command still running for a live worker.
    marker = "" if plan.namespaced else f"{os.getpid()}-{uuid.uuid4().hex}"
    base_env = {
        "PATH": SAFE_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PWD": str(cwd),
    }
    argv, process_env = plan.command_line(command, base_env, env, marker, timeout_ms, config)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=process_env,
            start_new_session=True,  # also detaches from any terminal, so no TIOCSTI tricks
        )
    except OSError as exc:
        raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
    assert proc.stdout is not None and proc.stderr is not None
    stdout = _CappedStream(proc.stdout, config.output_cap_bytes)
    stderr = _CappedStream(proc.stderr, config.output_cap_bytes)
    killed = False
    try:
        with _Pump(proc, (stdout, stderr)) as pump:
            timed_out = not pump.until_exit(started + timeout_ms / 1000)
            _kill_everything(proc, plan, marker)
            killed = True
            pump.drain(time.monotonic() + DRAIN_BOUND_S)
    finally:
        if not killed:  # interrupted: nothing may be left running
            _kill_everything(proc, plan, marker)
        returncode = _reap(proc)
        if plan.namespaced and returncode == 1 and stderr.remove_suffix(_UNSHARE_SAW_SIGKILL):
            returncode = -signal.SIGKILL
        stdout.close()
        stderr.close()
    return _result(stdout, stderr, returncode, timed_out, timeout_ms, started, plan.layers)


# -- planning: which layers this machine gives -------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Plan:
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
        command: str,
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
        shell = [SHELL, "-c", command]
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
def _plan(config: SandboxConfig, euid: int) -> _Plan:
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
        failure = _namespace_failure(argv)
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
    return _Plan(
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
def _namespace_failure(argv: tuple[str, ...]) -> str | None:
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


# -- reading output ----------------------------------------------------------------------------


class _CappedStream:
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


class _Pump:
    """Reads both pipes as data comes, and notices when the started process exits."""

    def __init__(self, proc: subprocess.Popen[bytes], streams: tuple[_CappedStream, ...]) -> None:
        self._proc = proc
        self._selector = selectors.PollSelector()
        self._buffer = bytearray(_READ_CHUNK)
        self._view = memoryview(self._buffer)
        self._open = 0
        for stream in streams:
            self._selector.register(stream.fd, selectors.EVENT_READ, stream)
            self._open += 1
        self._exit_fd: int | None = None
        with contextlib.suppress(OSError, AttributeError):
            self._exit_fd = os.pidfd_open(proc.pid)
            self._selector.register(self._exit_fd, selectors.EVENT_READ, None)

    def __enter__(self) -> _Pump:
        return self

    def __exit__(self, *exc: object) -> None:
        self._selector.close()
        self._view.release()
        if self._exit_fd is not None:
            os.close(self._exit_fd)

    def until_exit(self, deadline: float) -> bool:
        """Read until the process exits (True) or ``deadline`` passes (False)."""
        # Without a pidfd (kernels before 5.3) the exit is polled on a short tick.
        tick = None if self._exit_fd is not None else 0.02
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            wait = remaining if tick is None else min(tick, remaining)
            exited = False
            for key, _ in self._selector.select(wait):
                if key.data is None:
                    exited = True
                else:
                    self._read(key.data)
            if exited or (tick is not None and _has_exited(self._proc.pid)):
                return True

    def drain(self, deadline: float) -> None:
        """Read what is left, until both pipes close or ``deadline`` passes."""
        if self._exit_fd is not None:
            self._selector.unregister(self._exit_fd)
        while self._open:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return
            for key, _ in self._selector.select(remaining):
                self._read(key.data)

    def _read(self, stream: _CappedStream) -> None:
        try:
            count = os.readv(stream.fd, [self._buffer])
        except BlockingIOError:
            return
        if count == 0:
            stream.at_eof = True
            self._selector.unregister(stream.fd)
            self._open -= 1
            return
        stream.take(self._view[:count])


def _has_exited(pid: int) -> bool:
    # WNOWAIT leaves the process unreaped, so its pid (and process group) cannot be reused
    # before its leftovers are killed.
    try:
        info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return True
    return info is not None


# -- killing -----------------------------------------------------------------------------------


def _kill_everything(proc: subprocess.Popen[bytes], plan: _Plan, marker: str) -> None:
    """Kill the started process and every process the command left behind; wait until gone."""
    # The namespace's first process may have left the process group, and dropping root
    # cancelled its parent-death signal, so it is also killed by pid. Its pidfd is taken while
    # unshare, its parent, still holds it unreaped: the pid cannot have been reused.
    first = _pidfds(_children(proc.pid)) if plan.namespaced else []
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
        _sweep(marker, plan.sweep_uid)


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


def _children(pid: int) -> list[int]:
    found: list[int] = []
    with contextlib.suppress(OSError):
        for task in os.scandir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError), open(f"{task.path}/children") as listing:
                found += [int(child) for child in listing.read().split()]
    return found


def sweep_orphans(config: SandboxConfig) -> int:
    """Kill commands whose worker process died mid-call; returns how many were found.

    Without a PID namespace, a command's children outlive a worker process killed with SIGKILL
    (only the shell has the parent-death signal). A worker calls this when it starts a process.
    """
    plan = _plan(config, os.geteuid())
    if plan.sweep_uid is None:
        return 0
    prefix = f"{MARKER_VARIABLE}=".encode()
    orphans = 0
    for pid in _processes_of(plan.sweep_uid):
        for entry in _environ(pid).split(b"\0"):
            if entry.startswith(prefix):
                owner, _, _ = entry[len(prefix) :].partition(b"-")
                if owner.isdigit() and not _alive(int(owner)):
                    _kill_if_marked(pid, entry + b"\0")
                    orphans += 1
                break
    return orphans


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _sweep(marker: str, uid: int) -> None:
    """Kill every live process carrying ``marker``, those that left the session too.

    A killed process keeps its environment until it has exited, so the sweep ends when none
    is found: nothing of the command is running any more.
    """
    needle = f"{MARKER_VARIABLE}={marker}\0".encode()
    deadline = time.monotonic() + REAP_BOUND_S
    pause = 0.001
    while True:
        found = [pid for pid in _processes_of(uid) if needle in _environ(pid)]
        if not found or time.monotonic() > deadline:
            return
        for pid in found:
            _kill_if_marked(pid, needle)
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def _processes_of(uid: int) -> Iterator[int]:
    own = os.getpid()
    with os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == own:
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_uid == uid:
                    yield int(entry.name)


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as environ:
            return environ.read()
    except OSError:
        return b""


def _kill_if_marked(pid: int, needle: bytes) -> None:
    # Checked again through a pidfd, so a pid reused meanwhile is never signalled.
    try:
        pidfd = os.pidfd_open(pid)
    except OSError:
        return
    try:
        if needle in _environ(pid):
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
    except OSError:
        pass
    finally:
        os.close(pidfd)


def _reap(proc: subprocess.Popen[bytes]) -> int | None:
    try:
        return proc.wait(REAP_BOUND_S)
    except subprocess.TimeoutExpired:
        return None  # stuck in the kernel even after SIGKILL; reported as killed


# -- the result --------------------------------------------------------------------------------


def _result(
    stdout: _CappedStream,
    stderr: _CappedStream,
    returncode: int | None,
    timed_out: bool,
    timeout_ms: int,
    started: float,
    layers: tuple[str, ...],
) -> SandboxResult:
    errors = stderr.text()
    notice = ""
    if timed_out:
        exit_code = -1
        notice = (
            f"[timed out after {_duration(timeout_ms)}: the command and every process it "
            "started were killed]"
        )
    elif returncode is None:
        exit_code = -1
        notice = "[the command could not be stopped cleanly and was abandoned]"
    elif returncode < 0:
        signum = -returncode
        exit_code = 128 + signum
        notice = f"[the command was killed by {_signal_name(signum)}]"
    else:
        exit_code = returncode
    if notice:
        errors = f"{errors}\n{notice}" if errors and not errors.endswith("\n") else errors + notice
    return SandboxResult(
        stdout=stdout.text(),
        stderr=errors,
        exit_code=exit_code,
        timed_out=timed_out,
        duration_ms=round((time.monotonic() - started) * 1000),
        stdout_truncated=stdout.truncated,
        stderr_truncated=stderr.truncated,
        isolation=layers,
    )


def _duration(ms: int) -> str:
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms} ms"


def _signal_name(signum: int) -> str:
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    hint = _SIGNAL_HINTS.get(sig)
    return f"{sig.name} ({hint})" if hint else sig.name
