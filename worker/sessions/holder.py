"""A session's holder: a process of the worker's own that owns the session's terminal, starts
its shell in the run's box (through ``run_sandboxed``, as run_bash's commands: the run's uid,
its namespaces, its control groups and limits; in a run with an image, in its container, by
``worker.images.box_shells``), and answers the worker's calls on a unix socket it was handed,
listening, by the worker process that started it.

It ends, taking the shell and all it started with it, when it is asked to (the run ended, or a
``restart``), when no call came for the idle time the operator set, when the run's workspace is
gone, or when the worker that started it dies: a session never outlives its worker, so a call
after that finds no holder and answers "session lost". Its shell's last-resort end is the
parent-death signal every sandboxed command has: the holder gone, its box goes.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import secrets
import select
import socket
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from worker.contract.errors import ImageError
from worker.contract.network import NetworkPolicy
from worker.exceptions import RuntimeFailed
from worker.images.box_shells import (
    BoxPlace,
    BoxShell,
    end_box_shell,
    release_box_shell,
    start_box_shell,
)
from worker.images.boxes import Boxes
from worker.sandbox import SandboxConfig, SandboxError, run_sandboxed
from worker.sandbox.layers import plan_for
from worker.sandbox.start.launch import folder_id
from worker.sessions.records import SessionRecord
from worker.sessions.screen import Screen
from worker.sessions.shell import (
    box_shell_env,
    loopback_up,
    set_modes,
    shell_command,
    shell_env,
    type_into,
)
from worker.sessions.wire import (
    HolderAnswer,
    HolderRequest,
    read_line,
    send_line,
)

log = logging.getLogger("toolq.session")

#: The longest a session's shell may live, whatever else: its box's time limit.
LIFETIME_MS = 24 * 3600 * 1000
#: How long the shell may take to show its first prompt.
START_BOUND_S = 60.0
#: Between two looks at the worker, the workspace and the idle time.
LOOK_EVERY_S = 1.0
#: Output that stopped this long ago is what a program waiting for input shows.
QUIET_S = 0.5
#: How long ``type`` and ``read`` wait at most for output to settle.
SETTLE_S = 1.0
#: How long ``interrupt`` waits for the prompt before a quiet screen also ends its wait.
INTERRUPT_S = 5.0
#: How long the shell has to end once its terminal hangs up, before the holder exits anyway.
END_BOUND_S = 10.0
#: A call's own reading and writing of its line.
CONNECTION_S = 10.0


@dataclass(frozen=True, slots=True)
class HolderSpec:
    """What a holder is started with, from the worker process that starts it."""

    #: The listening socket, handed over open.
    listen_fd: int
    record: str
    home: str
    cwd: str
    identity: tuple[int, int] | None
    config: SandboxConfig
    #: The worker's main process: the holder ends when it does.
    watch_pid: int
    idle_s: float
    #: The run's network (``worker.egress``), its proxy served by the holder for the shell's
    #: whole life; None: loopback alone.
    network: NetworkPolicy | None = None
    #: The run's box, where the run has an image: the shell runs in it (``box_shells``).
    box: BoxPlace | None = None


class Holder:
    def __init__(self, spec: HolderSpec) -> None:
        self._spec = spec
        self._listener = socket.socket(fileno=spec.listen_fd)
        self._nonce = secrets.token_hex(8)
        self._screen = Screen(self._nonce, spec.config.output_cap_bytes)
        # In a box, the terminal is the box's own, its other end handed over as the shell
        # starts.
        self._master, self._slave = os.openpty() if spec.box is None else (-1, -1)
        self._box_shell: BoxShell | None = None
        self._box: threading.Thread | None = None
        self._reader: threading.Thread | None = None
        self._stopping = threading.Event()
        self._last_call = time.monotonic()
        self._workspace = folder_id(spec.home)

    def run(self) -> None:
        record = SessionRecord.read(Path(self._spec.record))
        watch = _pidfd(self._spec.watch_pid)
        if watch is None:
            self._end("its worker stopped before it started")
            return
        try:
            self._start_shell()
            if not self._first_prompt():
                self._end("its shell did not start")
                return
            if self._spec.box is None:
                loopback_up(self._master)  # a box's is up from its start
            if record is not None:
                record.model_copy(update={"holder_pid": os.getpid()}).write(Path(self._spec.record))
            self._serve(watch)
        finally:
            os.close(watch)

    def _start_shell(self) -> None:
        if self._spec.box is not None:
            self._start_box_shell(self._spec.box)
            return
        set_modes(self._slave)
        terminal = os.ttyname(self._slave)
        config = self._spec.config
        plan = plan_for(config, os.geteuid()).for_identity(self._spec.identity)
        if plan.drop_to is not None:
            # The run's alone: no other uid may open the terminal by its path.
            os.chown(terminal, *plan.drop_to)
        os.chmod(terminal, 0o600)
        self._box = threading.Thread(target=self._box_life, args=(terminal,), daemon=True)
        self._box.start()
        self._reader = threading.Thread(target=self._read_terminal, daemon=True)
        self._reader.start()

    def _start_box_shell(self, place: BoxPlace) -> None:
        deadline = time.monotonic() + START_BOUND_S
        key = Path(self._spec.record).stem
        record = place.record
        try:
            with Boxes(place.settings).turn(record.name, deadline, record.image):
                # Under the box's lock: no call's leftovers are killed before the shell is
                # known as a session's.
                file_size_mb = self._spec.config.settings.file_size_mb
                variables = box_shell_env(self._nonce)
                shell = start_box_shell(place, variables, file_size_mb, key, deadline)
        except (RuntimeFailed, ImageError) as exc:
            log.error("the shell could not start: %s", exc)
            self._screen.close()
            return
        self._box_shell = shell
        self._master = shell.master
        set_modes(self._master)
        release_box_shell(shell)
        self._box = threading.Thread(target=self._box_shell_life, args=(shell.pid,), daemon=True)
        self._box.start()
        self._reader = threading.Thread(target=self._read_terminal, daemon=True)
        self._reader.start()

    def _box_shell_life(self, pid: int) -> None:
        """Until the shell in the box ends (or the holder does)."""
        watch = _pidfd(pid)
        try:
            while watch is not None and not self._stopping.is_set():
                ready, _, _ = select.select([watch], [], [], LOOK_EVERY_S)
                if ready:
                    log.info("the shell ended")
                    return
        finally:
            if watch is not None:
                os.close(watch)
            self._screen.close()

    def _box_life(self, terminal: str) -> None:
        try:
            result = run_sandboxed(
                shell_command(terminal),
                cwd=Path(self._spec.cwd),
                home=Path(self._spec.home),
                env=shell_env(self._nonce),
                timeout_ms=LIFETIME_MS,
                config=self._spec.config,
                identity=self._spec.identity,
                network=self._spec.network,
            )
            log.info("the shell ended: exit %s", result.exit_code)
        except SandboxError as exc:
            log.error("the shell could not start: %s", exc)
        finally:
            self._screen.close()

    def _read_terminal(self) -> None:
        # A read blocked on the terminal would keep it open past its closing (no hang-up):
        # the reader looks, and stops when the holder ends.
        while not self._stopping.is_set():
            try:
                ready, _, _ = select.select([self._master], [], [], LOOK_EVERY_S / 4)
                if not ready:
                    continue
                data = os.read(self._master, 65536)
            except OSError:
                return
            if not data:
                return
            self._screen.append(data)

    def _first_prompt(self) -> bool:
        self._screen.wait(time.monotonic() + START_BOUND_S, None)
        _, _, at_prompt, _ = self._screen.take()
        return at_prompt and not self._screen.closed

    def _serve(self, watch: int) -> None:
        while True:
            listening = self._listener.fileno()
            ready, _, _ = select.select([listening, watch], [], [], LOOK_EVERY_S)
            if watch in ready:
                self._end("its worker stopped", lost=True)
                return
            if listening in ready:
                with contextlib.suppress(OSError):
                    conn, _ = self._listener.accept()
                    with conn:
                        if self._answer(conn):
                            return
                self._last_call = time.monotonic()
                continue
            if time.monotonic() - self._last_call > self._spec.idle_s:
                self._end(f"no call came for {self._spec.idle_s:g} s (TOOLQ_SESSION_IDLE_S)")
                return
            if folder_id(self._spec.home) != self._workspace:
                self._end("its run's workspace was removed", forget=True)
                return

    def _answer(self, conn: socket.socket) -> bool:
        """Answer one call; whether the holder is to end."""
        conn.settimeout(CONNECTION_S)
        request = HolderRequest.model_validate_json(read_line(conn))
        if request.action == "end":
            self._end("it was ended", conn)
            return True
        conn.settimeout(request.wait_ms / 1000 + CONNECTION_S)
        send_line(conn, self._act(request))
        return False

    def _act(self, request: HolderRequest) -> HolderAnswer:
        now = time.monotonic()
        deadline = now + request.wait_ms / 1000
        screen = self._screen
        if not screen.closed:
            if request.action == "type_submit":
                self._type(request.input + "\n", deadline)
                screen.wait(deadline, QUIET_S)
            elif request.action == "type":
                self._type(request.input, deadline)
                screen.wait(min(deadline, now + SETTLE_S), QUIET_S)
            elif request.action == "interrupt":
                self._type("\x03", deadline)
                screen.wait(min(deadline, now + INTERRUPT_S), None)
                # A loaded machine may take longer to bring the shell back; a program that
                # keeps running past Ctrl-C (a REPL) shows a prompt of its own and waits.
                screen.wait(deadline, QUIET_S)
            else:  # read
                screen.wait(min(deadline, now + SETTLE_S), QUIET_S)
        text, cut, at_prompt, exit_code = screen.take()
        output = text.decode("utf-8", errors="replace").replace("\r\n", "\n")
        return HolderAnswer(
            output=output,
            running=not at_prompt and not screen.closed,
            exit_code=exit_code,
            cut_bytes=cut,
            ended=screen.closed,
        )

    def _type(self, text: str, deadline: float) -> None:
        self._screen.typed()
        type_into(self._master, text.encode(), deadline)

    def _end(
        self,
        why: str,
        conn: socket.socket | None = None,
        *,
        lost: bool = False,
        forget: bool = False,
    ) -> None:
        """Hang up the terminal (the shell and its jobs get SIGHUP), wait a bounded time for its
        box to end, and say why the session ended where the next call finds it: unless it is
        ``lost`` (its worker stopped), which the next call tells by the record alone, or its
        run is over (``forget``): then nothing of it is left."""
        log.info("the session ends: %s", why)
        path = Path(self._spec.record)
        record = SessionRecord.read(path)
        if forget:
            forget_files(path)
        elif record is not None and not lost:
            record.model_copy(update={"ended": why}).write(path)
        self._listener.close()
        self._stopping.set()
        if self._reader is not None:
            self._reader.join(LOOK_EVERY_S)
        if self._box_shell is not None:
            end_box_shell(self._box_shell)
        for fd in (self._master, self._slave):
            if fd >= 0:
                os.close(fd)
        if self._box is not None:
            self._box.join(END_BOUND_S)
        if conn is not None:
            with contextlib.suppress(OSError):
                send_line(conn, HolderAnswer(ended=True))


def forget_files(record: Path) -> None:
    """Remove a session's files (its record, socket and log), and its run's folder once empty."""
    for suffix in (".json", ".sock", ".log"):
        record.with_suffix(suffix).unlink(missing_ok=True)
    with contextlib.suppress(OSError):
        record.parent.rmdir()


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def main() -> None:
    """Started by ``holders.start``: the spec comes pickled on standard input, from the worker
    process itself."""
    spec: HolderSpec = pickle.load(sys.stdin.buffer)  # noqa: S301 - written by the worker
    if os.fork():
        # Out of the starting process's children: it reaps this one now, and the holder's
        # life is its own (it watches the worker's main process instead).
        os._exit(0)
    os.setsid()
    log_path = Path(spec.record).with_suffix(".log")
    logging.basicConfig(filename=log_path, level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        Holder(spec).run()
    except Exception:
        log.exception("the holder failed")
    finally:
        # Whatever threads are left (a box that would not end) go with the process; the
        # parent-death signal of the shell's box ends it.
        logging.shutdown()
        os._exit(0)


if __name__ == "__main__":
    main()
