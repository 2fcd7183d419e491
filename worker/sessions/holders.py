"""The worker's side of a run's sessions: where their holders listen (a folder of the worker's
own, 0700, under the host's state, which no run can reach), starting one, asking it a call,
and ending them. Any worker process of the host reaches any holder of the host: the calls of a
run with a session are sent to the worker that holds it, whichever of its processes takes them.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import pickle
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from worker.contract.errors import RESTART_HINT, SessionEnded, SessionLost
from worker.contract.network import NetworkPolicy
from worker.images.box_shells import BoxPlace
from worker.images.owner import current_owner
from worker.plumbing.proc_stat import process_alive
from worker.sandbox import SandboxConfig
from worker.sessions.holder import START_BOUND_S, HolderSpec, forget_files
from worker.sessions.records import SessionRecord
from worker.sessions.wire import HolderAnswer, HolderRequest, read_line, send_line

#: Sessions a run may have at once: each is a shell and a holder.
MAX_SESSIONS_PER_RUN = 8
#: Beyond a call's own wait: the line's travel both ways, and a holder's start.
_MARGIN_S = 10.0
#: How long the worker waits for a holder to end when asked (its shell's end included).
_END_WAIT_S = 20.0
_STARTING_S = 30.0


def sessions_folder(config: SandboxConfig) -> Path:
    """The folder of every session of this host's workers: the host state's, root's alone."""
    folder = Path(config.host_state) / "sessions"
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    return folder


def sweep_sessions(config: SandboxConfig) -> int:
    """Forget the sessions of runs that are over (their workspace is gone) whose holder is gone
    too: what a holder lost with its worker leaves, which no call will ask about again. How
    many."""
    swept = 0
    for record_path in sessions_folder(config).glob("*/*.json"):
        record = SessionRecord.read(record_path)
        if record is None or not record.workspace or os.path.isdir(record.workspace):
            continue
        if record.holder_pid is not None and process_alive(record.holder_pid):
            continue  # it sees its workspace gone, and ends by itself
        forget_files(record_path)
        swept += 1
    return swept


class RunSessions:
    """The sessions of the run whose workspace is ``home``."""

    def __init__(
        self,
        config: SandboxConfig,
        home: Path,
        idle_s: float,
        network: NetworkPolicy | None = None,
        box: Callable[[], BoxPlace] | None = None,
    ) -> None:
        self._config = config
        #: Where the run has an image: its box, found as a session starts (a call to a
        #: session it has asks its holder alone, so a lost one says so first).
        self._box = box
        self._network = network
        self._home = home
        self._idle_s = idle_s
        key = hashlib.sha256(os.path.realpath(home).encode()).hexdigest()[:24]
        # Made by the run's first session, gone with its last.
        self.folder = sessions_folder(config) / key

    def ask(
        self,
        name: str,
        request: HolderRequest,
        *,
        cwd: Path,
        identity: tuple[int, int] | None,
    ) -> HolderAnswer:
        """The session's answer to ``request``; its holder started first where the run has no
        session of that name. ``SessionLost`` or ``SessionEnded`` when it had one, now gone."""
        record = SessionRecord.read(self._record(name))
        if record is None:
            started = time.monotonic()
            self._start(name, cwd, identity)
            # The shell's start is part of the call's time.
            spent_ms = int((time.monotonic() - started) * 1000)
            request = request.model_copy(update={"wait_ms": max(1, request.wait_ms - spent_ms)})
        return self._call(name, request, request.wait_ms / 1000 + _MARGIN_S + START_BOUND_S)

    def restart(self, name: str, *, cwd: Path, identity: tuple[int, int] | None) -> None:
        """End the session's shell, if it has one, and start another."""
        self.end(name)
        self._start(name, cwd, identity)

    def end(self, name: str) -> bool:
        """End the session (its shell and all it started), and forget it; whether it ran."""
        ended = False
        with contextlib.suppress(OSError, SessionLost, SessionEnded, ValueError):
            answer = self._call(name, HolderRequest(action="end", wait_ms=1), _END_WAIT_S)
            ended = answer.ended
        forget_files(self._record(name))
        return ended

    def end_all(self) -> int:
        """End every session of the run (its run ended); how many were running."""
        ended = 0
        for record_path in self.folder.glob("*.json"):
            record = SessionRecord.read(record_path)
            if record is not None and self.end(record.name):
                ended += 1
        with contextlib.suppress(OSError):
            self.folder.rmdir()
        return ended

    def names(self) -> list[str]:
        found = (SessionRecord.read(path) for path in self.folder.glob("*.json"))
        return sorted(record.name for record in found if record is not None)

    def _file(self, name: str, suffix: str) -> Path:
        # The name as a digest: any name the tool takes makes a short, safe file name.
        return self.folder / (hashlib.sha256(name.encode()).hexdigest()[:16] + suffix)

    def _record(self, name: str) -> Path:
        return self._file(name, ".json")

    def _socket(self, name: str) -> Path:
        return self._file(name, ".sock")

    def _call(self, name: str, request: HolderRequest, timeout_s: float) -> HolderAnswer:
        try:
            with _connected(self._socket(name)) as conn:
                conn.settimeout(timeout_s)
                send_line(conn, request)
                return HolderAnswer.model_validate_json(read_line(conn))
        except (ConnectionError, FileNotFoundError) as exc:
            raise self._gone(name) from exc

    def _gone(self, name: str) -> SessionLost | SessionEnded:
        record = SessionRecord.read(self._record(name))
        if record is not None and record.ended is not None:
            return SessionEnded(f"session {name!r} ended: {record.ended}; {RESTART_HINT}")
        return SessionLost(
            f"session lost: the shell of session {name!r} is gone with the worker that held it "
            f"(it stopped, and everything the shell held went with it); {RESTART_HINT}"
        )

    def _start(self, name: str, cwd: Path, identity: tuple[int, int] | None) -> None:
        self.folder.mkdir(mode=0o700, exist_ok=True)
        with _locked(self.folder):
            if SessionRecord.read(self._record(name)) is not None:
                return  # another call started it meanwhile
            if len(self.names()) >= MAX_SESSIONS_PER_RUN:
                raise ValueError(
                    f"the run has {MAX_SESSIONS_PER_RUN} sessions already, the most it may have: "
                    "use one of them, or end one with action 'restart' on it"
                )
            place = None if self._box is None else self._box()
            record_path = self._record(name)
            self._socket(name).unlink(missing_ok=True)
            listener = _bound(self._socket(name))
            # The worker process whose end ends the session: the Celery worker's main process
            # (which its pool processes inherit), else this process.
            worker_pid = current_owner().pid
            try:
                SessionRecord.new(name, worker_pid, str(self._home)).write(record_path)
                spec = HolderSpec(
                    listen_fd=listener.fileno(),
                    record=str(record_path),
                    home=str(self._home),
                    cwd=str(cwd),
                    identity=identity,
                    config=self._config,
                    watch_pid=worker_pid,
                    network=self._network,
                    idle_s=self._idle_s,
                    box=place,
                )
                starter = subprocess.Popen(
                    [sys.executable, "-m", "worker.sessions.holder"],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                    pass_fds=(listener.fileno(),),
                    start_new_session=True,
                    cwd="/",
                )
                starter.communicate(pickle.dumps(spec), timeout=_STARTING_S)
            finally:
                listener.close()


@contextlib.contextmanager
def _in_folder(path: Path) -> Iterator[str]:
    """``path`` by a short name (a socket's path has at most 107 bytes): through a descriptor
    of its folder."""
    fd = os.open(path.parent, os.O_PATH | os.O_DIRECTORY)
    try:
        yield f"/proc/self/fd/{fd}/{path.name}"
    finally:
        os.close(fd)


@contextlib.contextmanager
def _connected(path: Path) -> Iterator[socket.socket]:
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _in_folder(path) as short:
            conn.connect(short)
        yield conn
    finally:
        conn.close()


def _bound(path: Path) -> socket.socket:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        with _in_folder(path) as short:
            listener.bind(short)
        os.chmod(path, 0o600)
        listener.listen(16)
    except OSError:
        listener.close()
        raise
    return listener


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """The run's sessions folder locked: one call starts a session of a name. The folder
    itself is locked, so that it goes once its last session's files went."""
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)
