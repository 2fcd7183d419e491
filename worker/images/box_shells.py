"""A session's shell in its run's box: started by ``runc exec --detach --tty``, whose terminal
is the box's own (its devpts) and whose other end comes back over a console socket to the
session's holder; and which processes of the box are sessions', so that the step that kills
what a call left running spares them.

A session's shell leads a session of its own in the box (the runtime makes it so, its terminal
the controlling one): whatever it starts, in the foreground or in the background, is in that
session, and is spared, as is what those processes start in a session of their own (Inspect's
tools server, started in a session, keeps each of its shells in a new one: ``setsid``). A
process whose parent is neither is a call's leftover like any other: a call's own, or a daemon
that left the session and its parent (an orphan's parent is the box's first process, never a
session's), so that no call can slip a process of its own among a session's. Each shell's host
pid is written in its box's bundle, which no process of the box sees.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from worker.exceptions import RuntimeFailed
from worker.images.boxes import BoxRecord, BoxSettings
from worker.images.runtime import OciRuntime
from worker.images.spec import merged_env, process_config
from worker.plumbing.proc_stat import process_alive, session_and_parent

#: The bundle's folder of session shells' pid files.
_SHELLS = "session-shells"
#: The shell: the image's bash where it has one (a real one: an image may link its sh as
#: bash), else its sh (busybox's, an Alpine's). It waits for a first line, which the holder
#: types once it has set the terminal's modes (no echo): a shell reads them as it starts.
#: bash's prompt word is kept from what it starts (Inspect's tools server runs shells of its
#: own): its startup file, a here-document, stops exporting it.
_SHELL_ARGV = [
    "/bin/sh",
    "-c",
    "read -r _; "
    'if [ -n "$(bash -c \'echo "$BASH_VERSION"\' 2>/dev/null)" ]; then '
    "PS1= exec bash --noprofile --rcfile /dev/fd/3 --noediting -i 3<<'EOF'\n"
    "export -n PS1 PROMPT_COMMAND; exec 3<&-\n"
    "EOF\n"
    "fi; unset PROMPT_COMMAND; exec /bin/sh -i",
]


@dataclass(frozen=True, slots=True)
class BoxPlace:
    """Where a session's shell starts: the run's box, and how its worker makes boxes."""

    settings: BoxSettings
    record: BoxRecord
    #: The shell's first folder, as the box sees it.
    cwd: str


@dataclass(frozen=True, slots=True)
class BoxShell:
    #: The terminal's other end, the holder's.
    master: int
    #: The shell's pid, as the host sees it.
    pid: int
    pid_file: Path


def gvisor_refusal(settings: BoxSettings) -> str | None:
    """Why sessions cannot run in this worker's boxes, or None when they can."""
    if OciRuntime.find(settings.runtime, settings.cache_root).gvisor:
        return (
            f"bash_session does not run in a container of {settings.runtime} (gVisor), whose "
            "processes the worker cannot tell apart from a call's leftovers: use run_bash "
            "there, or TOOLQ_OCI_RUNTIME=runc"
        )
    return None


def start_box_shell(
    place: BoxPlace, variables: dict[str, str], file_size_mb: int, key: str, deadline: float
) -> BoxShell:
    """Start the session's shell in the box as the box's user, with the image's variables and
    the session's own over them (``worker.sessions.shell.box_shell_env``: its prompt word for
    bash, and for an image's sh in its ``PS1``). ``RuntimeFailed`` when the runtime could
    not."""
    record = place.record
    runtime = OciRuntime.find(place.settings.runtime, place.settings.cache_root)
    bundle = place.settings.cache_root / "boxes" / record.name
    process = process_config(
        _SHELL_ARGV,
        user=record.user,
        cwd=place.cwd,
        env=merged_env(record.env, variables),
        file_size_mb=file_size_mb,
    )
    process["terminal"] = True
    process["consoleSize"] = {"height": 50, "width": 200}
    shells = bundle / _SHELLS
    shells.mkdir(mode=0o700, exist_ok=True)
    process_file = bundle / f"session-{uuid.uuid4().hex[:12]}.json"
    process_file.write_text(json.dumps(process))
    pid_file = shells / f"{key}.pid"
    pid_file.unlink(missing_ok=True)
    # A folder of its own, short: a socket's path has at most 107 bytes.
    folder = tempfile.mkdtemp(prefix="toolq-console-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        path = os.path.join(folder, "c")
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(max(deadline - time.monotonic(), 0.1))
        argv = ["--detach", "--console-socket", path, "--process", str(process_file)]
        runtime.exec_detached([*argv, "--pid-file", str(pid_file), record.name], deadline)
        conn, _ = listener.accept()
        with conn:
            _, fds, _, _ = socket.recv_fds(conn, 1024, 1)
        if not fds:
            raise RuntimeFailed(f"{runtime.name} handed over no terminal")
        return BoxShell(master=fds[0], pid=int(pid_file.read_text().strip()), pid_file=pid_file)
    except (OSError, ValueError) as exc:
        pid_file.unlink(missing_ok=True)
        raise RuntimeFailed(f"the shell could not start in the container: {exc}") from None
    finally:
        listener.close()
        shutil.rmtree(folder, ignore_errors=True)
        process_file.unlink(missing_ok=True)


def release_box_shell(shell: BoxShell) -> None:
    """Let the shell start, the terminal's modes set."""
    os.write(shell.master, b"\n")


def end_box_shell(shell: BoxShell) -> None:
    """Kill the shell and all it started and left running (``session_processes``)."""
    shell.pid_file.unlink(missing_ok=True)
    for pid in _in_sessions({shell.pid}, _all_pids()) | {shell.pid}:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def session_processes(bundle: Path, pids: set[int]) -> set[int]:
    """Those of ``pids`` (a box's processes) that belong to one of the box's session shells."""
    leaders = set()
    for pid_file in (bundle / _SHELLS).glob("*.pid"):
        with contextlib.suppress(OSError, ValueError):
            pid = int(pid_file.read_text().strip())
            if process_alive(pid):
                leaders.add(pid)
    return _in_sessions(leaders, pids) if leaders else set()


def _in_sessions(leaders: set[int], pids: set[int]) -> set[int]:
    """Those of ``pids`` in a session ``leaders`` lead, and their descendants among ``pids``
    (in whatever session)."""
    # One read of each process's stat: this runs at the end of every call in a box with a session.
    found = {pid: ids for pid in pids if (ids := session_and_parent(pid)) is not None}
    spared = {pid for pid, (session, _) in found.items() if session in leaders}
    parents = {pid: parent for pid, (_, parent) in found.items() if pid not in spared}
    while True:
        children = {pid for pid, parent in parents.items() if parent in spared}
        if not children:
            return spared
        spared |= children
        for pid in children:
            del parents[pid]


def _all_pids() -> set[int]:
    return {int(entry) for entry in os.listdir("/proc") if entry.isdigit()}
