"""A probe that breaks run_bash 'true' into its parts, in process, configured as the sandbox
pool's workers are (a uid per run, private /tmp, /var/tmp, /dev/shm and /run, namespaces and
control groups), next to a bare ``sh -c true``.

Wall-clock probes (``bench.probes.WallProbe``) wrap the sandbox's steps for the probe's calls
only: the set-up until the command is handed over, the hand-over until the command's exit is
seen (``Pump.until_exit``), and the answer. The hand-over is told apart by the launch the call
took: one made for its run (its shell already waits as the run's uid) or one made for any run.
Calls go at once, as the bench's worker-ready calls come, and after a pause, as an agent's next
command follows a model turn. After the answer, off the call's path, the launcher's thread ends
the call's namespace (``ready_pool._end``) and makes the next launches (``launch.launch``, then the
init's word, ``Launch.confirm``). Two parts are timed on their own, in forked children:
exec of ``/bin/sh -c true`` by a process forked ahead (what a call costs where no shell waits
for it already as its run's uid), and the private folders' mounts (a tmpfs on each, and a bind
of a folder below them, as a run's workspace is bound). Run it before the bench starts threads
of its own: the children are forked.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from bench.probes import WallProbe
from bench.sandbox_layers import COMMAND, SHELL_ONLY, TIMEOUT_MS
from worker.contract.settings import WorkerSettings
from worker.sandbox import SandboxConfig, SandboxError, run_sandboxed
from worker.sandbox import output as pumping
from worker.sandbox.plan import PRIVATE_FOLDERS
from worker.sandbox.start import launch as launching
from worker.sandbox.start import ready_pool as launchers
from worker.tools.factory import prepare_workspace

IN_PROCESS = "run_sandboxed 'true' in process, the pool's configuration"
PAUSE_S = 0.05
PAUSED = f"the same after a pause of {PAUSE_S * 1000:.0f} ms"
SETUP = "set-up: the call's plan, uid and folders, a ready launch taken"
ANSWER = "answer: output read, exit status, usage from the call's groups"
#: The hand-over, by the launch a call took (``Plan.keep``: made for one run, its folders bound).
HANDOVER = "hand-over to exit: the call's line, the command, its exit"
RUN_LAUNCH = f"{HANDOVER}, on a launch made for its run (the shell waits as the run's uid)"
ANY_LAUNCH = f"{HANDOVER}, on a launch made for any run (binds, drops, execs the shell)"
EXEC = "exec of /bin/sh -c true by a process forked ahead (its word to its reaping)"
TMPFS = "a tmpfs on each of /tmp, /var/tmp, /dev/shm and /run (in a mount namespace)"
BIND = "a bind mount of a folder below them (as a run's workspace is bound)"
ENDED = "after the answer: the call's namespace and groups ended (launcher thread)"
MADE = "after the answer: the next launch made, until its init's word (launcher thread)"
LAUNCHER_THREAD = "toolq-launch"
RUN_ID = "bench-parts"

_CLONE_NEWNS = 0x00020000
_MS_NOSUID, _MS_NODEV, _MS_BIND, _MS_REC, _MS_PRIVATE = 2, 4, 4096, 1 << 14, 1 << 18
_O_PATH = 0o10000000
# Loaded before any fork: a child of a process with threads must not take the loader's lock.
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass
class SandboxParts:
    """Samples (ms) per part, the parts that could not be timed and why, the layers used."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    layers: list[str] = field(default_factory=list)


class _Probes:
    """The wall-clock probes on the sandbox's steps, installed for the probe's calls only."""

    def __init__(self) -> None:
        self.take = WallProbe(launchers.Launcher, "take", _launch_kind)
        self.exit = WallProbe(pumping.Pump, "until_exit")
        self.ended = WallProbe(launchers, "_end")
        self.made = WallProbe(launchers, "launch")
        self.confirmed = WallProbe(launching.Launch, "confirm")
        self.all = (self.take, self.exit, self.ended, self.made, self.confirmed)

    @contextlib.contextmanager
    def installed(self) -> Iterator[list[str]]:
        """Yields the steps that are not where the probe looks (the sandbox changed)."""
        missing = [f"{p.owner.__name__}.{p.attribute}" for p in self.all if not p.install()]
        try:
            yield missing
        finally:
            for probe in self.all:
                probe.uninstall()


def _launch_kind(launcher: object, plan: object, *args: object, **kwargs: object) -> str:
    return RUN_LAUNCH if getattr(plan, "keep", ()) else ANY_LAUNCH


def _time_shell() -> float:
    started = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", COMMAND], check=True)
    return (time.perf_counter() - started) * 1000


#: Run by ``python -I -S``, a process as small as the spawner (a child of a large one would
#: pay at exec for unmapping its parent's copy): for each line read, a child forked ahead waits
#: for a word, then execs the command; the answer is the ms from the word to its reaping.
_EXEC_AHEAD = f"""
import os, sys, time
for line in sys.stdin:
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(go_w)
        os.write(ready_w, b".")
        os.read(go_r, 1)
        os.execv("/bin/sh", ["/bin/sh", "-c", "{COMMAND}"])
    os.close(ready_w)
    os.close(go_r)
    os.read(ready_r, 1)
    started = time.perf_counter()
    os.write(go_w, b".")
    _, status = os.waitpid(pid, 0)
    elapsed = (time.perf_counter() - started) * 1000
    os.close(ready_r)
    os.close(go_w)
    print(elapsed if status == 0 else -1, flush=True)
"""


class ExecAhead:
    """Times exec of the command by a process forked ahead, in a small process of its own."""

    def __init__(self) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-S", "-c", _EXEC_AHEAD],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def time(self) -> float:
        assert self._proc.stdin is not None and self._proc.stdout is not None
        self._proc.stdin.write("\n")
        self._proc.stdin.flush()
        answer = self._proc.stdout.readline()
        if not answer or float(answer) < 0:
            raise SandboxError("the command forked ahead failed")
        return float(answer)

    def close(self) -> None:
        assert self._proc.stdin is not None
        self._proc.stdin.close()
        self._proc.wait(10)


def _mount(source: bytes | None, target: str, kind: bytes | None, flags: int, data: bytes) -> None:
    if _LIBC.mount(source, target.encode(), kind, flags, data or None) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"mount on {target}: {os.strerror(errno)}")


def _mounts_in_child(workspace: str, size_bytes: int, answer: int) -> None:
    """In a forked child: a mount namespace of its own, then the folders covered and the
    workspace bound back, each timed; the figures go to ``answer`` as JSON."""
    if _LIBC.unshare(_CLONE_NEWNS) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS)")
    _mount(b"none", "/", None, _MS_REC | _MS_PRIVATE, b"")
    kept = os.open(workspace, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    folders = [f for f in PRIVATE_FOLDERS if os.path.isdir(f) and not os.path.islink(f)]
    started = time.perf_counter()
    for folder in folders:
        mode = b"mode=0755," if folder == "/run" else b"mode=1777,"
        size = f"size={size_bytes}".encode()
        _mount(b"tmpfs", folder, b"tmpfs", _MS_NOSUID | _MS_NODEV, mode + size)
    covered = time.perf_counter()
    os.makedirs(workspace, mode=0o711, exist_ok=True)
    _mount(f"/proc/self/fd/{kept}".encode(), workspace, None, _MS_BIND | _MS_REC, b"")
    bound = time.perf_counter()
    figures = {"tmpfs_ms": (covered - started) * 1000, "bind_ms": (bound - covered) * 1000}
    os.write(answer, json.dumps(figures).encode())


def _time_mounts(workspace: Path, size_bytes: int) -> tuple[float, float]:
    """The private folders' tmpfs mounts and one bind, in ms, made in a forked child."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            _mounts_in_child(str(workspace), size_bytes, write_fd)
            code = 0
        except OSError as exc:
            os.write(write_fd, json.dumps({"error": str(exc)}).encode())
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as answer:
        figures = json.loads(answer.read() or b'{"error": "no answer"}')
    os.waitpid(pid, 0)
    if "error" in figures:
        raise SandboxError(f"the mounts could not be made: {figures['error']}")
    return figures["tmpfs_ms"], figures["bind_ms"]


def _run_folder(root: Path, config: SandboxConfig) -> tuple[Path, tuple[int, int] | None]:
    """A run's workspace as a worker prepares it (the worker's own, open to its run's group
    alone, below a root that cannot be listed), and the run's uid and gid."""
    workspace = prepare_workspace(root / RUN_ID, config)
    return workspace.root, workspace.owner


def _one_call(
    folder: Path, owner: tuple[int, int] | None, config: SandboxConfig, probes: _Probes
) -> tuple[dict[str, float], list[str]]:
    """One call of the pool's configuration: its total and parts, and the layers it used."""
    started = time.perf_counter()
    result = run_sandboxed(
        COMMAND,
        cwd=folder,
        home=folder,
        env={},
        timeout_ms=TIMEOUT_MS,
        config=config,
        identity=owner,
    )
    ended = time.perf_counter()
    if result.exit_code != 0:
        raise SandboxError(f"'true' failed: {result.stderr}")
    _, _, taken, kind = probes.take.spans[-1]
    exited = probes.exit.spans[-1][2]
    parts = {
        IN_PROCESS: ended - started,
        SETUP: taken - started,
        kind: exited - taken,
        ANSWER: ended - exited,
    }
    return {name: seconds * 1000 for name, seconds in parts.items()}, list(result.isolation)


def sandbox_parts(calls: int, warmup: int) -> SandboxParts:
    """Every part, one run of each series in turn, so that other load weighs on all alike."""
    found = SandboxParts()
    if os.geteuid() != 0:
        found.unavailable[IN_PROCESS] = "needs root, as the pool's workers run"
        return found
    probes = _Probes()
    ahead = ExecAhead()
    root = Path(tempfile.mkdtemp(prefix="toolq-bench-parts-"))
    root.chmod(0o755)
    try:
        config = SandboxConfig.from_settings(WorkerSettings(workspace_root=root))
        folder, owner = _run_folder(root, config)
        size = config.settings.memory_mb * 1024 * 1024

        def add(name: str, value: float) -> None:
            found.samples.setdefault(name, []).append(value)

        def sandboxed() -> None:
            parts, found.layers = _one_call(folder, owner, config, probes)
            for name, value in parts.items():
                add(name, value)

        def paused() -> None:
            time.sleep(PAUSE_S)
            parts, _ = _one_call(folder, owner, config, probes)
            add(PAUSED, parts[IN_PROCESS])
            kind = next(name for name in parts if name.startswith(HANDOVER))
            add(kind, parts[kind])

        def mounts() -> None:
            tmpfs, bind = _time_mounts(folder, size)
            add(TMPFS, tmpfs)
            add(BIND, bind)

        series: dict[str, Callable[[], None]] = {
            IN_PROCESS: sandboxed,
            SHELL_ONLY: lambda: add(SHELL_ONLY, _time_shell()),
            EXEC: lambda: add(EXEC, ahead.time()),
            TMPFS: mounts,
            PAUSED: paused,
        }
        with probes.installed() as missing:
            if missing:
                found.unavailable[IN_PROCESS] = f"the sandbox's steps moved: {', '.join(missing)}"
                del series[IN_PROCESS], series[PAUSED]
            for name, run in list(series.items()):
                try:
                    run()  # a trial: a series that cannot run here is left out, saying why
                except (SandboxError, OSError) as exc:
                    found.unavailable[name] = str(exc)
                    del series[name]
            for index in range(warmup + calls):
                if index == warmup:
                    found.samples.clear()
                    for probe in (probes.ended, probes.made, probes.confirmed):
                        probe.spans.clear()
                for run in series.values():
                    run()
        if IN_PROCESS in series:
            found.samples[ENDED] = probes.ended.durations_ms(LAUNCHER_THREAD)
            made = probes.made.durations_ms(LAUNCHER_THREAD)
            confirmed = probes.confirmed.durations_ms(LAUNCHER_THREAD)
            found.samples[MADE] = [a + b for a, b in zip(made, confirmed, strict=False)]
    finally:
        # The launches kept ready for the probe's configuration go, with their groups.
        launchers.launcher.release()
        ahead.close()
        shutil.rmtree(root, ignore_errors=True)
    found.samples = {name: values for name, values in found.samples.items() if values}
    return found


def parts_note(p50: dict[str, float], noop_ms: float, above_noop_ms: float) -> str:
    """Where run_bash 'true' through the pool goes, from the parts' p50s (ms)."""

    def ms(name: str) -> str:
        return f"{p50[name]:.2f}" if name in p50 else "none"

    around = above_noop_ms - p50[IN_PROCESS]
    return (
        f"The parts of run_bash 'true' (p50, ms). Through the pool: a no-op's round trip "
        f"{noop_ms:.2f}, and {above_noop_ms:.2f} above it. In process, configured as the pool's "
        f"workers are, a call sent at once takes {ms(IN_PROCESS)} ({ms(PAUSED)} after a pause "
        f"of {PAUSE_S * 1000:.0f} ms): {ms(SETUP)} set-up until the command is handed over; "
        f"from the hand-over to the command's exit {ms(ANY_LAUNCH)} on a launch made for any "
        f"run (the call binds its folders, drops to its run's uid and execs the shell) and "
        f"{ms(RUN_LAUNCH)} on one made for its run (its shell already waits as the run's uid); "
        f"{ms(ANSWER)} for the answer (parts timed call by call: their p50s need not add up). "
        f"Timed on their own: exec of /bin/sh -c true by a process forked ahead {ms(EXEC)} (a "
        f"bare {SHELL_ONLY} {ms(SHELL_ONLY)} in the same turns, its fork and wait included); "
        f"the private folders' tmpfs mounts {ms(TMPFS)} for the four, a bind below them "
        f"{ms(BIND)}. The worker around the sandbox (its tool path, the start marker's wait, "
        f"the workspace's accounting, the hops between processes) takes the rest, "
        f"{around:.2f} by difference. Off the call's path, after the answer: the call's "
        f"namespace and groups end in {ms(ENDED)}, and a launch is ready {ms(MADE)} after it "
        "is asked for, at the lowest priority on the same cores: a call that comes sooner "
        "than its run's launch is ready takes one made for any run."
    )
