"""Running one command from start to end: started under the plan (inside its control groups,
where it has them), its output pumped until it exits or its time is up, then everything it
started killed, its result and usage told, and its group removed."""

from __future__ import annotations

import os
import subprocess
import time
import uuid
from collections.abc import Mapping
from pathlib import Path

from worker.sandbox.config import SAFE_PATH, SandboxConfig, SandboxError
from worker.sandbox.ending import Ending
from worker.sandbox.launch import launcher
from worker.sandbox.output import CappedStream, Notice, Pump
from worker.sandbox.plan import plan_for
from worker.sandbox.result import SandboxResult, build_result

#: How long to keep reading once the command has ended and its leftovers were killed: their
#: pipes close at once, unless something escaped (possible only without a PID namespace).
DRAIN_BOUND_S = 0.5


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
    argv, process_env = plan.command_line(command, base_env, env, marker, timeout_ms, config)
    if not plan.grouped:
        started = time.monotonic()
        try:
            proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=process_env,
                start_new_session=True,  # also detaches from any terminal: no TIOCSTI tricks
            )
        except OSError as exc:
            raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
        return _follow(proc, Ending(proc, plan, marker, None, None), started, timeout_ms, config)
    ready = launcher.take(plan, config)
    try:
        started = time.monotonic()
        ready.start(argv, cwd, process_env)
        channel = ready.channel if plan.has_init else None
        ending = Ending(ready.proc, plan, marker, ready.group, channel)
        return _follow(ready.proc, ending, started, timeout_ms, config)
    finally:
        ready.channel.close()
        ready.group.remove()
        launcher.prepare(plan, config)


def _follow(
    proc: subprocess.Popen[bytes],
    ending: Ending,
    started: float,
    timeout_ms: int,
    config: SandboxConfig,
) -> SandboxResult:
    """Pump the started command's output until it ends or its time is up, end everything it
    started, and tell how it went."""
    assert proc.stdout is not None and proc.stderr is not None
    stdout = CappedStream(proc.stdout, config.output_cap_bytes)
    stderr = CappedStream(proc.stderr, config.output_cap_bytes)
    notices: tuple[tuple[int, Notice], ...] = ()
    if ending.init_socket is not None:
        notices = ((ending.init_socket.fileno(), ending.command_started),)
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
    return build_result(
        stdout,
        stderr,
        returncode,
        timed_out,
        timeout_ms,
        started,
        ending.plan.layers,
        ending.usage(),
        config.memory_mb,
    )
