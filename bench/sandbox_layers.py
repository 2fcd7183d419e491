"""Timing ``worker.sandbox.run_sandboxed`` in process, mode by mode, as a root worker and as an
unprivileged one, next to ``subprocess.run`` of a bare shell and of the same wrapped command line.

The sandbox picks its layers by the effective uid, so the unprivileged modes run in a forked
child that has given up root. All modes take turns, one run each, so that other work on the
machine weighs on all of them alike.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
import pwd
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from worker import sandbox
from worker.contract.sandbox_settings import SandboxSettings
from worker.sandbox import Isolation, SandboxConfig, SandboxError, describe_isolation, run_sandboxed
from worker.sandbox.layers import plan_for

COMMAND = "true"
TIMEOUT_MS = 10_000
SHELL_ONLY = "subprocess.run(['/bin/sh', '-c', 'true'])"
Runner = Callable[[], float]
UNPRIVILEGED_USER = "nobody"


@dataclass(frozen=True)
class Mode:
    unprivileged: bool
    isolation: Isolation

    @property
    def who(self) -> str:
        return "unprivileged worker" if self.unprivileged else "root worker"


MODES = (
    Mode(unprivileged=True, isolation="process"),
    Mode(unprivileged=True, isolation="namespaces"),
    Mode(unprivileged=False, isolation="process"),
    Mode(unprivileged=False, isolation="namespaces"),
)
#: Where run_bash's own cost is told apart from its wrappers': the least isolated mode.
PLUMBING_MODE = MODES[0]


class Timer:
    """Times one run of each kind in the calling process."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def describe(self, isolation: Isolation) -> list[str]:
        return describe_isolation(SandboxConfig(SandboxSettings(uid_range="", isolation=isolation)))

    def sandboxed(self, isolation: Isolation) -> float:
        config = SandboxConfig(SandboxSettings(uid_range="", isolation=isolation))
        started = time.perf_counter()
        result = run_sandboxed(
            COMMAND,
            cwd=self.folder,
            home=self.folder,
            env={},
            timeout_ms=TIMEOUT_MS,
            config=config,
        )
        elapsed = (time.perf_counter() - started) * 1000
        if result.exit_code != 0:
            raise SandboxError(f"'true' failed: {result.stderr}")
        return elapsed

    def same_command_line(self, isolation: Isolation) -> float:
        """``subprocess.run`` of the wrapped command line ``run_sandboxed`` would start."""
        config = SandboxConfig(SandboxSettings(uid_range="", isolation=isolation))
        base_env = {"PATH": sandbox.SAFE_PATH, "HOME": str(self.folder), "PWD": str(self.folder)}
        try:
            # The plan is the sandbox's inside: if it changes, this series is left out.
            plan = plan_for(config, os.geteuid())
            argv, env = plan.command_line(
                COMMAND, base_env, {}, uuid.uuid4().hex, TIMEOUT_MS, config
            )
        except (AttributeError, TypeError) as exc:
            raise SandboxError(f"the sandbox's command line cannot be built here: {exc}") from exc
        started = time.perf_counter()
        subprocess.run(
            argv,
            env=env,
            cwd=self.folder,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            start_new_session=True,
            check=True,
        )
        return (time.perf_counter() - started) * 1000


def _serve(conn: Connection, folder: Path) -> None:
    """In the forked child: give up root, then answer ``(method, isolation)`` requests."""
    refusal: SandboxError | None = None
    try:
        nobody = pwd.getpwnam(UNPRIVILEGED_USER)
        os.setgroups([])
        os.setgid(nobody.pw_gid)
        os.setuid(nobody.pw_uid)
    except (KeyError, OSError) as exc:
        refusal = SandboxError(f"cannot run as {UNPRIVILEGED_USER!r}: {exc}")
    timer = Timer(folder)
    while (request := conn.recv()) is not None:
        method, isolation = request
        if refusal is not None:
            conn.send(refusal)
            continue
        try:
            conn.send(getattr(timer, method)(isolation))
        except (SandboxError, OSError, subprocess.CalledProcessError) as exc:
            conn.send(SandboxError(str(exc)))


class UnprivilegedTimer:
    """A ``Timer`` in a forked child that is not root."""

    def __init__(self, folder: Path) -> None:
        context = multiprocessing.get_context("fork")
        self._conn, theirs = context.Pipe()
        self._child = context.Process(target=_serve, args=(theirs, folder), daemon=True)
        self._child.start()
        theirs.close()

    def _ask(self, method: str, isolation: Isolation) -> Any:
        self._conn.send((method, isolation))
        answer = self._conn.recv()
        if isinstance(answer, SandboxError):
            raise answer
        return answer

    def describe(self, isolation: Isolation) -> list[str]:
        return list(self._ask("describe", isolation))

    def sandboxed(self, isolation: Isolation) -> float:
        return float(self._ask("sandboxed", isolation))

    def same_command_line(self, isolation: Isolation) -> float:
        return float(self._ask("same_command_line", isolation))

    def close(self) -> None:
        self._conn.send(None)
        self._child.join(30)
        self._conn.close()


@dataclass
class LayerTimings:
    """Samples (ms) per series, why some series could not run, and the labels the goal uses."""

    samples: dict[str, list[float]] = field(default_factory=dict)
    unavailable: dict[str, str] = field(default_factory=dict)
    plumbing: tuple[str, str] | None = None


def sandboxed_label(mode: Mode, layers: list[str]) -> str:
    return f"run_sandboxed, {mode.who}, isolation={mode.isolation} ({', '.join(layers)})"


def same_line_label(mode: Mode) -> str:
    return f"subprocess.run of the same command line, {mode.who}, isolation={mode.isolation}"


def _time_shell() -> float:
    started = time.perf_counter()
    subprocess.run(["/bin/sh", "-c", COMMAND], check=True)
    return (time.perf_counter() - started) * 1000


def _timer_for(
    mode: Mode, root: Timer, unprivileged: UnprivilegedTimer | None
) -> Timer | UnprivilegedTimer | None:
    """Who runs ``mode``: this process, the child that gave up root, or nobody here."""
    if os.geteuid() != 0:
        return root if mode.unprivileged else None
    return unprivileged if mode.unprivileged else root


def _series(
    root: Timer, unprivileged: UnprivilegedTimer | None, found: LayerTimings
) -> dict[str, Runner]:
    """Every series that works here, after one trial run of each."""
    runners: dict[str, Runner] = {SHELL_ONLY: _time_shell}
    for mode in MODES:
        timer = _timer_for(mode, root, unprivileged)
        if timer is None:
            found.unavailable[f"{mode.who}, isolation={mode.isolation}"] = "needs root"
            continue
        try:
            label = sandboxed_label(mode, timer.describe(mode.isolation))
        except SandboxError as exc:
            found.unavailable[f"{mode.who}, isolation={mode.isolation}"] = str(exc)
            continue
        candidates = {label: functools.partial(timer.sandboxed, mode.isolation)}
        if mode == PLUMBING_MODE:
            line = same_line_label(mode)
            candidates[line] = functools.partial(timer.same_command_line, mode.isolation)
        for name, runner in candidates.items():
            try:
                runner()
            except SandboxError as exc:
                found.unavailable[name] = str(exc)
            else:
                runners[name] = runner
        if mode == PLUMBING_MODE and label in runners and same_line_label(mode) in runners:
            found.plumbing = (label, same_line_label(mode))
    return runners


def sandbox_layers(calls: int, warmup: int) -> LayerTimings:
    """Run it before any thread starts: the unprivileged modes are timed in a forked child."""
    found = LayerTimings()
    with tempfile.TemporaryDirectory(prefix="toolq-bench-sandbox-") as name:
        folder = Path(name)
        folder.chmod(0o777)
        unprivileged = UnprivilegedTimer(folder) if os.geteuid() == 0 else None
        try:
            runners = _series(Timer(folder), unprivileged, found)
            found.samples = {label: [] for label in runners}
            for index in range(warmup + calls):
                for label, runner in runners.items():
                    elapsed = runner()
                    if index >= warmup:
                        found.samples[label].append(elapsed)
        finally:
            if unprivileged is not None:
                unprivileged.close()
    return found
