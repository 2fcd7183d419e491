"""The OCI runtime, by its command line: runc (or crun) from PATH, or runsc (gVisor), which puts
a kernel of its own in user space between the run and the host, as ``TOOLQ_OCI_RUNTIME`` says.

Its state (``--root``) is kept under the image cache, so the sweep finds every container a
worker made, even one whose worker died.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.exceptions import RuntimeFailed
from worker.plumbing.proc_stat import process_alive

#: How long a runtime's own bookkeeping command (state, kill, delete) may take.
_QUICK_S = 30.0
#: How long a killed runsc box's sandbox is waited for before it is deleted the sure way.
_END_WAIT_S = 5.0
#: Between two looks at whether it has exited.
_END_POLL_S = 0.005
_LOG_MESSAGE = re.compile(r'msg="(?P<msg>(?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class OciRuntime:
    """One OCI runtime: its binary, its name (runc, crun, runsc) and its state folder."""

    binary: str
    name: str
    root: Path

    @classmethod
    def find(cls, setting: str, cache_root: Path) -> OciRuntime:
        """The runtime ``TOOLQ_OCI_RUNTIME`` names (a name on PATH or a path);
        ``RuntimeFailed`` when there is none."""
        found = shutil.which(setting)
        if found is None:
            raise RuntimeFailed(
                f"the OCI runtime {setting!r} (TOOLQ_OCI_RUNTIME) is not installed on the "
                "sandbox worker (Debian's runc, crun or runsc package)"
            )
        name = Path(found).name
        return cls(found, name, cache_root / "runtime" / name)

    @property
    def gvisor(self) -> bool:
        return self.name.startswith("runsc")

    def _base(self) -> list[str]:
        argv = [self.binary, "--root", str(self.root)]
        if self.gvisor:
            # gVisor's own network stack with loopback alone; every command of it must say so.
            argv.append("--network=none")
        return argv

    def create(self, name: str, bundle: Path, pid_file: Path, deadline: float) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        # The box's first process keeps the runtime's standard streams: a pipe would never
        # close, so its output goes to a file of the bundle.
        argv = ["create", "--bundle", str(bundle), "--pid-file", str(pid_file), name]
        try:
            self._run(argv, deadline, output=bundle / "create.log")
        except RuntimeFailed:
            if self.state(name) is None:
                raise
            # A box of the name ended moments ago, still being forgotten (``end_now``).
            self.delete(name)
            self._run(argv, deadline, output=bundle / "create.log")

    def start(self, name: str, deadline: float) -> None:
        self._run(["start", name], deadline)

    def state(self, name: str) -> dict[str, Any] | None:
        """The runtime's view of ``name`` (``status``, ``pid``...); None when it has none."""
        found = self._quick_json(["state", name])
        return found if isinstance(found, dict) else None

    def running(self, name: str) -> bool:
        state = self.state(name)
        return state is not None and state.get("status") == "running"

    def names(self) -> list[str]:
        """Every container in this runtime's state folder."""
        found = self._quick_json(["list", "--format", "json"]) if self.root.is_dir() else None
        listed = found if isinstance(found, list) else []
        return [str(c.get("id")) for c in listed if isinstance(c, dict) and c.get("id")]

    def processes(self, name: str) -> list[int]:
        """The pids of ``name``'s processes (as the host sees them with runc, as the box does
        with runsc); none when they cannot be listed."""
        found = self._quick_json(["ps", "--format", "json", name])
        listed = found if isinstance(found, list) else []
        pids = [p.get("PID") if isinstance(p, dict) else p for p in listed]
        return [int(p) for p in pids if isinstance(p, int)]

    def kill_process(self, name: str, pid: int) -> None:
        """SIGKILL one process of the box (runsc names it by its pid in the box)."""
        if self.gvisor:
            with contextlib.suppress(RuntimeFailed):  # already gone
                self._run(["kill", "--pid", str(pid), name, "KILL"], time.monotonic() + _QUICK_S)
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)

    def delete(self, name: str) -> None:
        """End ``name`` and forget it, whatever its state; nothing when it is not known."""
        try:
            self._run(["delete", "--force", name], time.monotonic() + _QUICK_S)
        except RuntimeFailed:
            if self.state(name) is not None:
                raise

    def end_now(self, name: str, sandbox_pid: int) -> None:
        """End ``name`` when nothing of it is to be kept (its run is over), without waiting
        for more than its processes to die.

        runsc: its root process is killed (SIGKILL: its sandbox, the box's kernel, exits with
        it, and everything the box ran), and once the sandbox (``sandbox_pid``) has exited the
        box is forgotten by a ``runsc delete`` left to finish in the background: delete itself
        waits until whoever adopted the exited sandbox reaps it, over a second where that init
        is slow. A box still there after ``_END_WAIT_S`` is deleted the sure way. Other
        runtimes: ``delete --force``, which returns as soon as the box is gone."""
        if not self.gvisor:
            self.delete(name)
            return
        try:
            self._run(["kill", name, "KILL"], time.monotonic() + _QUICK_S)
        except RuntimeFailed:
            self.delete(name)  # not running (or not known): nothing to wait for
            return
        waited_until = time.monotonic() + _END_WAIT_S
        while process_alive(sandbox_pid) and time.monotonic() < waited_until:
            time.sleep(_END_POLL_S)
        if process_alive(sandbox_pid):
            self.delete(name)
            return
        try:
            subprocess.Popen(
                [*self._base(), "delete", "--force", name],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError:
            self.delete(name)

    def exec_argv(self, name: str, process: Path, pid_file: Path) -> list[str]:
        """The command line that runs ``process`` (a process.json) in ``name`` and ends with it."""
        return [
            *self._base(),
            "exec",
            "--process",
            str(process),
            "--pid-file",
            str(pid_file),
            name,
        ]

    def exec_detached(self, arguments: Sequence[str], deadline: float) -> None:
        """``exec --detach`` with ``arguments``: returns once the process started."""
        self._run(["exec", *arguments], deadline)

    def _quick_json(self, arguments: list[str]) -> Any:
        """What a bookkeeping command prints, read as JSON; None when it fails."""
        try:
            return json.loads(self._run(arguments, time.monotonic() + _QUICK_S) or b"null")
        except (RuntimeFailed, ValueError):
            return None

    def _run(self, arguments: Sequence[str], deadline: float, output: Path | None = None) -> bytes:
        try:
            with open(output, "w+b") if output is not None else contextlib.nullcontext() as log:
                done = subprocess.run(
                    [*self._base(), *arguments],
                    stdin=subprocess.DEVNULL,
                    stdout=log or subprocess.PIPE,
                    stderr=log or subprocess.PIPE,
                    timeout=max(deadline - time.monotonic(), 0.1),
                    check=False,
                    # The box outlives this process and its session: a worker process
                    # replaced (or a terminal's signal) must not reach it.
                    start_new_session=True,
                )
                if log is not None:
                    log.seek(0)
                    done.stdout, done.stderr = b"", log.read(65536)
        except subprocess.TimeoutExpired:
            raise RuntimeFailed(f"{self.name} {arguments[0]} did not finish in time") from None
        except OSError as exc:
            raise RuntimeFailed(f"{self.name} could not run: {exc}") from None
        if done.returncode != 0:
            raise RuntimeFailed(f"{self.name} {arguments[0]}: {complaint(done.stderr)}")
        return done.stdout


def complaint(stderr: bytes) -> str:
    """A runtime's error output as one line: its logged message, or its last line."""
    text = stderr.decode("utf-8", "replace")
    messages = [m["msg"].replace('\\"', '"') for m in _LOG_MESSAGE.finditer(text)]
    lines = [line for line in text.strip().splitlines() if line.strip()]
    found = messages[-1] if messages else lines[-1] if lines else "no message"
    return " ".join(found.split())[:400]
