"""Ending a command: killing it and everything it started, reaping it, and telling what
happened (its exit status, a timeout, the signal that killed it) in the result."""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass

from worker.sandbox.config import REAP_BOUND_S
from worker.sandbox.output import CappedStream
from worker.sandbox.plan import Plan
from worker.sandbox.sweep import sweep_marked

#: What util-linux's unshare (2.38) prints, exiting with 1, when its child died of SIGKILL.
_UNSHARE_SAW_SIGKILL = b"unshare: sigprocmask unblock failed: Invalid argument\n"

_SIGNAL_HINTS = {
    signal.SIGXCPU: "CPU time limit reached",
    signal.SIGXFSZ: "file size limit reached",
    signal.SIGKILL: "out of memory or CPU time, or killed from outside",
    signal.SIGSEGV: "segmentation fault",
}


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


def kill_everything(proc: subprocess.Popen[bytes], plan: Plan, marker: str) -> None:
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
        sweep_marked(marker, plan.sweep_uid)


def reap(proc: subprocess.Popen[bytes], plan: Plan, stderr: CappedStream) -> int | None:
    """The started process's exit status (negative: the signal that killed the command), or
    None when it could not be reaped."""
    try:
        returncode = proc.wait(REAP_BOUND_S)
    except subprocess.TimeoutExpired:
        return None  # stuck in the kernel even after SIGKILL; reported as killed
    if plan.namespaced and returncode == 1 and stderr.remove_suffix(_UNSHARE_SAW_SIGKILL):
        return -signal.SIGKILL
    return returncode


def build_result(
    stdout: CappedStream,
    stderr: CappedStream,
    returncode: int | None,
    timed_out: bool,
    timeout_ms: int,
    started: float,
    layers: tuple[str, ...],
) -> SandboxResult:
    """The result of a command that has ended, with a notice of how it ended when it did not
    exit by itself."""
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


def _duration(ms: int) -> str:
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms} ms"


def _signal_name(signum: int) -> str:
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    hint = _SIGNAL_HINTS.get(sig)
    return f"{sig.name} ({hint})" if hint else sig.name
