"""One command in a run's box: ``runc exec`` (or ``runsc exec``) under the call's limits, its
output capped while it is read, its time limit held, what it left running killed, and what it
used told, as ``run_sandboxed`` tells it for a command on the worker's own file system.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO

from worker.contract.errors import EnvironmentLost
from worker.contract.network import NetworkPolicy
from worker.egress import Egress, NoNetworkNamespace, open_egress
from worker.exceptions import SandboxError
from worker.images.box_shells import session_processes
from worker.images.boxes import Boxes, BoxRecord, box_group
from worker.images.group import BoxGroup
from worker.images.runtime import OciRuntime
from worker.images.spec import merged_env, process_config
from worker.sandbox.bounded import wait_at_most
from worker.sandbox.config import SHELL, SandboxConfig
from worker.sandbox.output import CappedStream, Pump
from worker.sandbox.result import SandboxResult, Usage, build_result

#: How long to read once the command and its leftovers were killed.
_DRAIN_S = 0.5
#: Bound on the runtime's own exit after the command's, and on killing what it left.
_END_S = 5.0
#: Between two looks for runc's pid file of a call.
_PID_FILE_POLL_S = 0.001


def run_in_box(
    boxes: Boxes,
    record: BoxRecord,
    command: str | Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    timeout_ms: int,
    config: SandboxConfig,
    stdin: bytes | None = None,
    before_start: Callable[[], None] | None = None,
    network: NetworkPolicy | None = None,
) -> SandboxResult:
    """Run ``command`` (a string through ``/bin/sh -c``, a sequence as the argv) in the run's
    box, in ``cwd`` (a folder of the run's workspace, as the box sees it). ``EnvironmentLost``
    when the box is gone; nothing of the command ran then. ``network``: the run's, served by
    a proxy listening in the box's network namespace for the call."""
    deadline = time.monotonic() + timeout_ms / 1000
    runtime = boxes.runtime(record.image)
    with (
        boxes.turn(record.name, deadline, record.image),
        box_egress(record, runtime, network) as egress,
    ):
        boxes.check(record)
        if egress is not None:
            env = {**env, **egress.env}
        bundle = boxes.folder / record.name
        argv = [SHELL, "-c", command] if isinstance(command, str) else list(command)
        process = process_config(
            argv,
            user=record.user,
            cwd=inside_path(record, cwd),
            env=merged_env(record.env, env),
            file_size_mb=config.settings.file_size_mb,
            cpu_s=-(-timeout_ms // 1000) + 1,
        )
        call = uuid.uuid4().hex[:12]
        process_file = bundle / f"call-{call}.json"
        pid_file = bundle / f"call-{call}.pid"
        process_file.write_text(json.dumps(process))
        try:
            with _input(stdin) as source:
                result = _follow(
                    boxes, record, runtime, process_file, pid_file, source, deadline,
                    timeout_ms, config, before_start,
                )  # fmt: skip
            if egress is None:
                return result
            counts = egress.close()
            return result.with_network(counts.allowed, counts.refused, counts.notice)
        finally:
            process_file.unlink(missing_ok=True)
            pid_file.unlink(missing_ok=True)


@contextlib.contextmanager
def box_egress(
    record: BoxRecord, runtime: OciRuntime, network: NetworkPolicy | None
) -> Iterator[Egress | None]:
    """The run's proxy for one call, listening in the box's network namespace; None for a run
    without network."""
    if network is None or network.is_none:
        yield None
        return
    if runtime.gvisor:
        raise SandboxError(
            f"a box of {runtime.name} (gVisor) has a network stack of its own, which the "
            f'worker\'s proxy cannot serve: run {record.run_id} may ask only for network "none" '
            "there (TOOLQ_OCI_RUNTIME=runc or crun gives a run with an image a network)"
        )
    try:
        egress = open_egress(network, record.init_pid)
    except (OSError, NoNetworkNamespace) as exc:
        raise SandboxError(f"the network of run {record.run_id}'s box: {exc}") from None
    try:
        yield egress
    finally:
        egress.close()


def layers(record: BoxRecord) -> tuple[str, ...]:
    """What a command in ``record``'s box runs under, as ``isolation`` names it."""
    held = record.limits
    grouped = ["memory"]
    grouped += [] if held is not None and held.pids is None else ["pids"]
    grouped += ["cpu"] if held is not None and held.cpu is not None else []
    return (
        f"container:{record.runtime}",
        f"image:{record.digest}",
        "user-namespace",
        "run-uid",
        "pid-namespace",
        "mount-namespace",
        "network-namespace",
        "no-new-privileges",
        "rlimits",
        f"cgroup({','.join(grouped)})",
    )


def _follow(
    boxes: Boxes,
    record: BoxRecord,
    runtime: OciRuntime,
    process_file: Path,
    pid_file: Path,
    source: IO[bytes] | int,
    deadline: float,
    timeout_ms: int,
    config: SandboxConfig,
    before_start: Callable[[], None] | None,
) -> SandboxResult:
    group = box_group(boxes.settings, record)
    before = group.begin_call()
    if before_start is not None:
        before_start()
    started = time.monotonic()
    proc = subprocess.Popen(
        runtime.exec_argv(record.name, process_file, pid_file),
        stdin=source,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        # Out of the worker's session: a signal for the worker is not the command's.
        start_new_session=True,
    )
    assert proc.stdout is not None and proc.stderr is not None
    stdout = CappedStream(proc.stdout, config.output_cap_bytes)
    stderr = CappedStream(proc.stderr, config.output_cap_bytes)
    killed = 0
    # runc's exec copies the command's output until no process holds it: it ends when the
    # command's leftovers are killed, so the command's own exit is followed (its pidfd).
    # runsc's ends with the command.
    command_fd = None if runtime.gvisor else _command_pidfd(proc, pid_file, deadline)
    try:
        with Pump(proc, (stdout, stderr), exit_fd=command_fd) as pump:
            timed_out = not pump.until_exit(deadline)
            if timed_out and command_fd is not None:
                _kill_command(runtime, record, pid_file)
            killed = _kill_leftovers(boxes, runtime, record, group)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(_END_S)
            pump.drain(time.monotonic() + _DRAIN_S)
    finally:
        if command_fd is not None:
            os.close(command_fd)
        if proc.poll() is None:
            proc.kill()
            wait_at_most(proc, _END_S, f"the runtime's exec of a call in run {record.run_id}'s box")
        stdout.close()
        stderr.close()
    # A command that failed may have failed because the box did: then nothing of it ran, or
    # the box died under it.
    if proc.returncode != 0 and not runtime.running(record.name):
        raise EnvironmentLost(
            f"the container of run {record.run_id} (image {record.image!r}) stopped"
        )
    usage = group.call_usage(before, killed) if not runtime.gvisor else _gvisor_usage(killed)
    held = record.limits
    if held is not None:
        usage = dataclasses.replace(usage, cpu_limit=held.cpu)
    result = build_result(
        stdout,
        stderr,
        proc.returncode,
        timed_out,
        timeout_ms,
        started,
        layers(record),
        usage,
        config.settings.memory_mb if held is None or held.memory_mb is None else held.memory_mb,
    )
    return result if held is None else dataclasses.replace(result, limits_held=held)


def _command_pidfd(proc: subprocess.Popen[bytes], pid_file: Path, deadline: float) -> int | None:
    """A pidfd of the command runc started (its pid file is written as it starts), or one that
    reads as ended where the command is already gone; None when runc ended first (it could not
    start it)."""
    while time.monotonic() < deadline and proc.poll() is None:
        with contextlib.suppress(OSError, ValueError):
            text = pid_file.read_text().strip()
            if text:
                try:
                    return os.pidfd_open(int(text))
                except ProcessLookupError:
                    return _ended()
        time.sleep(_PID_FILE_POLL_S)
    return None


def _ended() -> int:
    """A file descriptor that polls readable at once, as an ended command's pidfd does: for a
    command runc started and reaped before its pidfd was opened (a quick one on a busy machine).
    Following runc's exit instead would wait for what the command left running, which holds
    runc's exec open until it is killed: until the call's deadline."""
    read_end, write_end = os.pipe()
    os.close(write_end)
    return read_end


def _kill_command(runtime: OciRuntime, record: BoxRecord, pid_file: Path) -> None:
    """The call's own process, past its time: the runtime's exec ends with it."""
    with contextlib.suppress(OSError, ValueError):
        runtime.kill_process(record.name, int(pid_file.read_text().strip()))


def _kill_leftovers(boxes: Boxes, runtime: OciRuntime, record: BoxRecord, group: BoxGroup) -> int:
    """Kill what the call left running in the box, its first process and the run's shell
    sessions (``box_shells``) aside; how many."""
    if not runtime.gvisor:
        bundle = boxes.folder / record.name
        return group.kill_all_but(
            record.init_pid,
            time.monotonic() + _END_S,
            lambda pids: session_processes(bundle, pids),
        )
    others = [pid for pid in runtime.processes(record.name) if pid != 1]
    for pid in others:
        runtime.kill_process(record.name, pid)
    return len(others)


def _gvisor_usage(killed: int) -> Usage:
    # gVisor's processes live in its own kernel: the host's group holds its sandbox, not
    # them. What it used is not told per call.
    return Usage(cpu_ms=None, max_rss_kb=None, pids_peak=None, killed_processes=killed)


def inside_path(record: BoxRecord, cwd: Path) -> str:
    """``cwd`` (a folder of the workspace on the worker) as the box sees it."""
    relative = os.path.relpath(cwd, record.workspace)
    if relative == ".":
        return record.workdir
    if relative.startswith(".."):
        raise EnvironmentLost(f"{cwd} is not in the run's workspace, which the container sees")
    return os.path.join(record.workdir, relative)


@contextlib.contextmanager
def _input(data: bytes | None) -> Iterator[IO[bytes] | int]:
    """The command's standard input: ``data`` in an unnamed file the runtime hands over, or
    nothing."""
    if data is None:
        yield subprocess.DEVNULL
        return
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.seek(0)
        yield file
