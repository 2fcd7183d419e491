"""Running one command from start to end: started under the plan, its output pumped until it
exits or its time is up, then everything it started killed and its result told."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from worker.sandbox.config import SAFE_PATH, SandboxConfig, SandboxError
from worker.sandbox.ending import SandboxResult, build_result, kill_everything, reap
from worker.sandbox.output import CappedStream, Pump
from worker.sandbox.plan import plan_for

#: How long to keep reading once the command has ended and its leftovers were killed: their
#: pipes close at once, unless something escaped (possible only without a PID namespace).
DRAIN_BOUND_S = 0.5


def run_sandboxed(
    command: str | Sequence[str],
    *,
    cwd: Path,
    home: Path,
    env: Mapping[str, str],
    timeout_ms: int,
    config: SandboxConfig,
    stdin: bytes | None = None,
) -> SandboxResult:
    """Run ``command`` in ``cwd`` (a string through ``/bin/sh -c``, a sequence as the argv),
    with ``stdin`` as its input (none by default), kill everything it started, report the
    outcome."""
    plan = plan_for(config, os.geteuid())
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
        with _input_file(stdin) as input_fd:
            proc = subprocess.Popen(
                argv,
                stdin=input_fd,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=cwd,
                env=process_env,
                start_new_session=True,  # also detaches from any terminal, so no TIOCSTI tricks
            )
    except OSError as exc:
        raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
    assert proc.stdout is not None and proc.stderr is not None
    stdout = CappedStream(proc.stdout, config.output_cap_bytes)
    stderr = CappedStream(proc.stderr, config.output_cap_bytes)
    killed = False
    try:
        with Pump(proc, (stdout, stderr)) as pump:
            timed_out = not pump.until_exit(started + timeout_ms / 1000)
            kill_everything(proc, plan, marker)
            killed = True
            pump.drain(time.monotonic() + DRAIN_BOUND_S)
    finally:
        if not killed:  # interrupted: nothing may be left running
            kill_everything(proc, plan, marker)
        returncode = reap(proc, plan, stderr)
        stdout.close()
        stderr.close()
    return build_result(stdout, stderr, returncode, timed_out, timeout_ms, started, plan.layers)


@contextlib.contextmanager
def _input_file(data: bytes | None) -> Iterator[int]:
    """The command's standard input: nothing, or ``data`` in an unlinked temporary file. A file,
    not a pipe: the command reads it at its own pace and the worker never blocks writing it."""
    if data is None:
        yield subprocess.DEVNULL
        return
    with tempfile.TemporaryFile() as file:
        file.write(data)
        file.seek(0)
        yield file.fileno()
