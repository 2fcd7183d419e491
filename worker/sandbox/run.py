"""Running one command from start to end: its control group made, started under the plan, its
output pumped until it exits or its time is up, then everything it started killed, its result
and usage told, and its group removed."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from worker.sandbox.callgroup import CallGroup
from worker.sandbox.config import SAFE_PATH, SandboxConfig, SandboxError
from worker.sandbox.ending import Ending
from worker.sandbox.output import CappedStream, Notice, Pump
from worker.sandbox.plan import Plan, plan_for
from worker.sandbox.result import SandboxResult, build_result

#: How long to keep reading once the command has ended and its leftovers were killed: their
#: pipes close at once, unless something escaped (possible only without a PID namespace).
DRAIN_BOUND_S = 0.5
_MB = 1024 * 1024


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
    plan = plan_for(config, os.geteuid())
    group = None
    if plan.grouped:
        group = CallGroup.create(
            plan.cgroups,
            # The plan's own processes in the group do not count against the command.
            max_processes=config.max_processes + plan.machinery,
            memory_bytes=config.memory_mb * _MB,
        )
    try:
        return _run(command, cwd, home, env, timeout_ms, config, plan, group)
    finally:
        if group is not None:
            group.remove()


def _run(
    command: str,
    cwd: Path,
    home: Path,
    env: Mapping[str, str],
    timeout_ms: int,
    config: SandboxConfig,
    plan: Plan,
    group: CallGroup | None,
) -> SandboxResult:
    # The marker names the worker process too, so a later sweep can tell an orphan (its worker
    # was killed mid-call) from a command still running for a live worker.
    marker = "" if plan.sweep_uid is None else f"{os.getpid()}-{uuid.uuid4().hex}"
    base_env = {
        "PATH": SAFE_PATH,
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PWD": str(cwd),
    }
    join_files = group.join_files if group is not None else []
    argv, process_env = plan.command_line(
        command, base_env, env, marker, timeout_ms, config, join_files
    )
    # The namespace's init tells on its standard input when the command started.
    init_socket, init_end = socket.socketpair() if plan.has_init else (None, None)
    started = time.monotonic()
    try:
        proc = subprocess.Popen(
            argv,
            stdin=init_end.fileno() if init_end is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=cwd,
            env=process_env,
            start_new_session=True,  # also detaches from any terminal, so no TIOCSTI tricks
        )
    except OSError as exc:
        if init_socket is not None:
            init_socket.close()
        raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
    finally:
        if init_end is not None:
            init_end.close()
    assert proc.stdout is not None and proc.stderr is not None
    stdout = CappedStream(proc.stdout, config.output_cap_bytes)
    stderr = CappedStream(proc.stderr, config.output_cap_bytes)
    ending = Ending(proc, plan, marker, group, init_socket)
    notices: tuple[tuple[int, Notice], ...] = ()
    if init_socket is not None:
        notices = ((init_socket.fileno(), ending.command_started),)
    killed = False
    try:
        with Pump(proc, (stdout, stderr), notices) as pump:
            timed_out = not pump.until_exit(started + timeout_ms / 1000)
            ending.kill_everything()
            killed = True
            pump.drain(time.monotonic() + DRAIN_BOUND_S)
    finally:
        if not killed:  # interrupted: nothing may be left running
            ending.kill_everything()
        returncode = ending.reap(stderr)
        stdout.close()
        stderr.close()
        if init_socket is not None:
            with contextlib.suppress(OSError):
                init_socket.close()
    return build_result(
        stdout,
        stderr,
        returncode,
        timed_out,
        timeout_ms,
        started,
        plan.layers,
        ending.usage(),
        config.memory_mb,
    )
