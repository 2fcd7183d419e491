"""What a command's run tells: its output, how it ended (its exit status, a timeout, the signal
that killed it, the memory limit) and what it used."""

from __future__ import annotations

import signal
import time
from dataclasses import dataclass, replace

from worker.contract.run_limits import RunLimits
from worker.sandbox.output import CappedStream

_SIGNAL_HINTS = {
    signal.SIGXCPU: "CPU time limit reached",
    signal.SIGXFSZ: "file size limit reached",
    signal.SIGKILL: "out of memory or CPU time, or killed from outside",
    signal.SIGSEGV: "segmentation fault",
}


@dataclass(frozen=True, slots=True)
class Usage:
    """What a command and everything it started used; None where this machine cannot tell (no
    control group does that job: see ``worker.sandbox.cgroup_layout``)."""

    #: CPU time, user and system, of every process of the command (without a control group:
    #: of those the command waited for).
    cpu_ms: int | None
    #: The most memory the command's processes held at once (their control group's peak:
    #: resident memory, the page cache they filled included).
    max_rss_kb: int | None
    #: The most processes the command had at once.
    pids_peak: int | None
    #: Processes still running when the command ended or timed out, which the sandbox killed.
    killed_processes: int | None
    #: The memory limit stopped a process of the command.
    oom_killed: bool = False
    #: Connections the run's egress proxy made for the command, and refused (``worker.egress``);
    #: None for a run without network.
    network_allowed: int | None = None
    network_refused: int | None = None
    #: The CPUs the command's processes were held to together (a control group's CPU
    #: bandwidth); None: no CPU limit held, none being asked or none holdable here.
    cpu_limit: float | None = None


NO_USAGE = Usage(cpu_ms=None, max_rss_kb=None, pids_peak=None, killed_processes=None)


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
    usage: Usage = NO_USAGE
    #: The memory, process and CPU limits a run's container held (a field null: none held);
    #: None: the command's configuration's, its CPU limit ``usage.cpu_limit``.
    limits_held: RunLimits | None = None

    def with_network(self, allowed: int, refused: int, notice: str = "") -> SandboxResult:
        """This result with the connections its run's egress proxy allowed and refused in its
        usage, and ``notice`` (a line per refusal, naming what and why) at the end of stderr."""
        usage = replace(self.usage, network_allowed=allowed, network_refused=refused)
        stderr = self.stderr
        if notice:
            stderr += ("" if not stderr or stderr.endswith("\n") else "\n") + notice
        return replace(self, usage=usage, stderr=stderr)


def build_result(
    stdout: CappedStream,
    stderr: CappedStream,
    returncode: int | None,
    timed_out: bool,
    timeout_ms: int,
    started: float,
    layers: tuple[str, ...],
    usage: Usage = NO_USAGE,
    memory_mb: int = 0,
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
        notice = f"[the command was killed by {_signal_name(signum, usage.oom_killed)}]"
    else:
        exit_code = returncode
    if usage.oom_killed and not notice.startswith("[the command was killed by"):
        notice += (" " if notice else "") + (
            f"[out of memory: a process of the command was killed at the memory limit "
            f"({memory_mb} MB)]"
        )
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
        usage=usage,
    )


def _duration(ms: int) -> str:
    return f"{ms // 1000} s" if ms % 1000 == 0 else f"{ms} ms"


def _signal_name(signum: int, oom_killed: bool) -> str:
    try:
        sig = signal.Signals(signum)
    except ValueError:
        return f"signal {signum}"
    hint = _SIGNAL_HINTS.get(sig)
    if sig == signal.SIGKILL and oom_killed:
        hint = "out of memory: the memory limit was reached"
    return f"{sig.name} ({hint})" if hint else sig.name
