"""The spawner: one small process per worker process that makes a root worker's launches with
system calls instead of programs.

A launch made of programs starts five of them (a shell that joins the groups, setpriv, unshare,
setpriv again, the init) before the call's own; on a small machine that is most of what a
sandboxed call costs. The spawner is this file, run by the worker's Python with nothing else
imported (``python -I -S``): it holds nothing of the worker's. For each launch it forks a
process that joins the call's groups, makes the namespaces (PID, mount, network) and forks the
namespace's init; the init mounts the namespace's /proc, drops to the sandbox user where the
launch says so, and forks the process that becomes the command, which reads the call from the
socket and execs it. That is the contract of a bash init that forks ahead (``Plan.forks_ahead``):
the worker finds the same processes, reads the command's exit status through its pidfd, and ends
the call the same way.

The spawner lives as long as its worker's end of the control socket: when the worker dies the
spawner exits, each launch's first process dies with it (parent-death signal), the init with
that, and the namespace with the init.

Only the standard library: this file runs before, and apart from, anything of toolq's.
"""

from __future__ import annotations

import ctypes
import json
import os
import resource
import signal
import socket
import stat
import sys
from typing import Any

#: The niceness the spawner and what it makes run at until a call starts.
LAUNCH_NICENESS = 19
#: The largest request (join files and the drop) and call (argv, folder, variables) accepted.
MAX_MESSAGE = 1 << 20
#: The OOM killer's score adjustment of every process of a call: the first it takes.
OOM_FIRST = 1000
#: Exit statuses a launch's processes use as a shell would: the setting up failed (125), the
#: command's folder or limits could not be set (126), the command could not be run (127).
SETUP_FAILED, CANNOT_ENTER, CANNOT_RUN = 125, 126, 127

_CLONE_NEWNS, _CLONE_NEWPID, _CLONE_NEWNET = 0x00020000, 0x20000000, 0x40000000
_CLONE_NEWIPC = 0x08000000
#: keyctl(2)'s number by architecture, and its operation that gives a new session keyring.
_SYS_KEYCTL = {"x86_64": 250, "aarch64": 219}.get(os.uname().machine)
_KEYCTL_JOIN_SESSION_KEYRING = 1
#: Where POSIX message queues show as files; the call's own IPC namespace has its own.
_MQUEUE = "/dev/mqueue"
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC, _MS_REC, _MS_PRIVATE = 2, 4, 8, 1 << 14, 1 << 18
_MS_BIND = 4096
_SYS_MOVE_MOUNT, _MOVE_MOUNT_F_EMPTY_PATH, _AT_FDCWD = 429, 0x04, -100
_O_PATH = 0o10000000
_PR_SET_PDEATHSIG, _PR_SET_NAME, _PR_SET_NO_NEW_PRIVS = 1, 15, 38
_RLIMITS = {
    "cpu": resource.RLIMIT_CPU,
    "fsize": resource.RLIMIT_FSIZE,
    "as": resource.RLIMIT_AS,
    "nproc": resource.RLIMIT_NPROC,
}


def _libc() -> Any:
    return ctypes.CDLL(None, use_errno=True)


def _call(result: int, what: str) -> None:
    if result != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, f"{what}: {os.strerror(errno)}")


def _name(libc: Any, name: bytes) -> None:
    libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name), 0, 0, 0)


def _die_with_parent(libc: Any, parent: int) -> None:
    _call(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    if os.getppid() != parent:  # the parent died before the signal was set
        os._exit(SETUP_FAILED)


def _fail(code: int, message: str) -> None:
    os.write(2, f"toolq sandbox: {message}\n".encode(errors="replace"))
    os._exit(code)


def _drop(libc: Any, uid: int, gid: int) -> None:
    os.setgroups([])
    os.setgid(gid)
    os.setuid(uid)
    _call(libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(NO_NEW_PRIVS)")


def _let_go_of_output() -> None:
    """The launch's own processes hold no end of the command's pipes: they close when the
    command and what it started are done."""
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 1)
    os.dup2(null, 2)
    os.close(null)


def _read_line(channel: socket.socket) -> tuple[bytes, list[int]]:
    """One line from the worker (empty: the worker let the launch go, or died), and the
    descriptors sent with it."""
    data = bytearray()
    received: list[int] = []
    while not data.endswith(b"\n"):
        chunk, fds, _, _ = socket.recv_fds(channel, 65536, 1)
        received += fds
        if not chunk or len(data) > MAX_MESSAGE:
            return b"", received
        data += chunk
    return bytes(data), received


def _wait_in_a_shell(channel: socket.socket, request: dict[str, Any]) -> None:
    """The process forked ahead becomes the call's shell before the call comes, with the
    environment and the limits every call has: it reads the rest of the call from the socket
    (as fd 3) and runs it itself (``shell_text.shell_ahead_line``)."""
    os.dup2(channel.fileno(), 3)
    for name, (soft, hard) in request["limits"].items():
        resource.setrlimit(_RLIMITS[name], (soft, hard))
    shell = request["shell"]
    os.execve(shell[0], shell, request["env"])


def _run_the_call(
    libc: Any, channel: socket.socket, request: dict[str, Any], covered: dict[str, int]
) -> None:
    """The process forked ahead: wait for the call, set it up, become the command; or, where
    the init has dropped to the sandbox user already, become the shell that waits for it."""
    _name(libc, b"toolq-command")
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGPIPE, signal.SIGXFSZ):
        signal.signal(number, signal.SIG_DFL)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    if request["shell"] is not None:
        _wait_in_a_shell(channel, request)
    line, received = _read_line(channel)
    if not line:
        os._exit(0)
    call = json.loads(line)
    try:
        _bind(libc, covered, call.get("bind") or [])
        if received and call.get("attach") is not None:
            # The run's volume, mounted on the host after this launch copied its mounts.
            where = call["attach"]
            path, flags = where.encode(), _MOVE_MOUNT_F_EMPTY_PATH
            moved = libc.syscall(_SYS_MOVE_MOUNT, received[0], b"", _AT_FDCWD, path, flags)
            _call(moved, f"attach the run's volume at {where}")
    except OSError as exc:
        _fail(CANNOT_ENTER, f"cannot show the call its folders: {exc}")
    for fd in received:
        os.close(fd)
    for fd in covered.values():
        os.close(fd)
    try:
        os.chdir(call["cwd"])
    except OSError as exc:
        _fail(CANNOT_ENTER, f"cannot enter {call['cwd']}: {exc.strerror}")
    try:
        for name, (soft, hard) in call["limits"].items():
            resource.setrlimit(_RLIMITS[name], (soft, hard))
        if call["drop"] is not None:
            _drop(libc, *call["drop"])
    except (OSError, ValueError) as exc:
        _fail(CANNOT_ENTER, f"cannot set the command's limits: {exc}")
    argv = call["argv"]
    try:
        os.execvpe(argv[0], argv, call["env"])  # found on the command's PATH, as a shell would
    except OSError as exc:
        _fail(CANNOT_RUN if exc.errno == 2 else CANNOT_ENTER, f"{argv[0]}: {exc.strerror}")


def _cover(libc: Any, private: dict[str, Any]) -> dict[str, int]:
    """Cover each folder of ``private["folders"]`` with an empty file system of the launch's own
    (its /tmp, /run and the like), then bind each (source, target) pair of ``private["bind"]``
    (when the launch is made for a known run: its /tmp, its workspace, the calls' inputs).

    Returns a descriptor of each folder as it was before it was covered, by its path: a call
    binds its own folders through them (``_bind``). They close when the command starts."""
    covered: dict[str, int] = {}
    size = f"size={private['size_bytes']}".encode()
    for folder in private["folders"]:
        if os.path.islink(folder) or not os.path.isdir(folder):
            continue
        covered[folder] = os.open(folder, _O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
        mode = b"mode=0755," if folder == "/run" else b"mode=1777,"
        _call(
            libc.mount(b"tmpfs", folder.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, mode + size),
            f"mount tmpfs on {folder}",
        )
    _bind(libc, covered, private["bind"])
    return covered


def _bind(libc: Any, covered: dict[str, int], pairs: list[list[str]]) -> None:
    """Bind each source folder (or file: the run's /etc/passwd) at its target, in order; a
    source that a covered folder hides is found below that folder as it was. A source bound at
    its own path is bound back only where something covers it."""
    for source, target in pairs:
        folder = _below(source, covered)
        if folder is None and source == target:
            continue
        if folder is None:
            fd = os.open(source, _O_PATH | os.O_CLOEXEC)
        else:
            relative = os.path.relpath(source, folder)
            fd = os.open(relative, _O_PATH | os.O_CLOEXEC, dir_fd=covered[folder])
        try:
            _bind_at(libc, fd, target)
        finally:
            os.close(fd)


def _below(path: str, covered: dict[str, int]) -> str | None:
    """The covered folder ``path`` lies in, if any."""
    return next((f for f in covered if path == f or path.startswith(f.rstrip("/") + "/")), None)


def _bind_at(libc: Any, fd: int, path: str) -> None:
    if stat.S_ISDIR(os.fstat(fd).st_mode):
        os.makedirs(path, mode=0o711, exist_ok=True)
    source = f"/proc/self/fd/{fd}".encode()
    _call(libc.mount(source, path.encode(), None, _MS_BIND | _MS_REC, None), f"bind {path}")


def _init(libc: Any, channel: socket.socket, request: dict[str, Any]) -> None:
    """The namespace's first process: its /proc, the drop, the command's process forked ahead,
    then, reaping what ends, the wait for the worker's word that the call is over."""
    _name(libc, b"toolq-init")
    _call(libc.mount(b"none", b"/", None, _MS_REC | _MS_PRIVATE, None), "mount --make-rprivate /")
    flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
    _call(libc.mount(b"proc", b"/proc", b"proc", flags, None), "mount /proc")
    if os.path.isdir(_MQUEUE) and not os.path.islink(_MQUEUE):
        # The queues of the call's own IPC namespace, not the host's, show there.
        _call(libc.mount(b"mqueue", _MQUEUE.encode(), b"mqueue", flags, None), "mount mqueue")
    private = request.get("private")
    covered = _cover(libc, private) if private is not None else {}
    if request["ready_in"] is not None:
        os.chdir(request["ready_in"])
    if request["drop"] is not None:
        # Made for a known run: its folders are bound already, none is left to bind.
        for fd in covered.values():
            os.close(fd)
        covered = {}
        _drop(libc, *request["drop"])
    # Set after the drop: changing user clears it.
    _call(libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0), "prctl(PDEATHSIG)")
    command = os.fork()
    if command == 0:
        _run_the_call(libc, channel, request, covered)
    for fd in covered.values():
        os.close(fd)
    _let_go_of_output()
    channel.sendall(b"\n")
    # What ends in the namespace is reaped at once, the command and every orphan that came to
    # the init alike: a zombie counts against the call's process limit until it is. The socket
    # is the command's until it ends: then the init reads it, for the worker's word.
    while os.waitpid(-1, 0)[0] != command:
        pass
    signal.signal(signal.SIGCHLD, _reap)
    _reap()
    while channel.recv(4096):
        pass
    os._exit(0)


def _launch(libc: Any, spawner: int, channel: socket.socket, request: dict[str, Any]) -> None:
    """A launch's first process: in the call's groups, it makes the namespaces and waits for
    their init, as unshare would."""
    _name(libc, b"toolq-launch")
    _die_with_parent(libc, spawner)
    for join in request["join"]:
        try:
            with open(join, "w") as file:
                file.write("0")
        except OSError as exc:
            _fail(SETUP_FAILED, f"cannot join {join}: {exc.strerror}")
    # Where memory runs short for the worker and its calls together (a pod's limit, the host's),
    # the kernel's OOM killer takes a call's processes before the worker.
    try:
        with open("/proc/self/oom_score_adj", "w") as adj:
            adj.write(str(OOM_FIRST))
    except OSError:
        pass
    # A session keyring of the call's own, which every process of the call inherits and which
    # goes with the last of them: without one, they would share their uid's user-session
    # keyring with the runs given the uid later.
    # (Where keyctl's number is unknown, the worker names no such layer either.)
    keyring = _SYS_KEYCTL is not None
    if keyring and libc.syscall(_SYS_KEYCTL, _KEYCTL_JOIN_SESSION_KEYRING, None) < 0:
        _fail(SETUP_FAILED, "cannot give the call a session keyring of its own")
    try:
        # The IPC namespace: SysV IPC and POSIX message queues made in the call go with it.
        _call(libc.unshare(_CLONE_NEWPID | _CLONE_NEWNS | _CLONE_NEWNET | _CLONE_NEWIPC), "unshare")
        init = os.fork()
        if init == 0:
            _die_with_parent(libc, os.getppid())
            _init(libc, channel, request)
    except OSError as exc:
        _fail(SETUP_FAILED, str(exc))
    channel.close()
    _let_go_of_output()
    _, status = os.waitpid(init, 0)
    code = os.waitstatus_to_exitcode(status)
    if code < 0:
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code)


def _reap(*_: object) -> None:
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass


def _serve(control: socket.socket) -> None:
    libc = _libc()
    spawner = os.getpid()
    _name(libc, b"toolq-spawner")
    # Launches are made, and calls' namespaces end, at the lowest priority: between calls, not
    # in their way. The worker gives each command's process the normal priority as its call
    # starts.
    os.nice(LAUNCH_NICENESS)
    signal.signal(signal.SIGCHLD, _reap)
    while True:
        message = control.recv(MAX_MESSAGE)
        if not message:
            return  # the worker is gone
        request = json.loads(message)
        worker_end, launch_end = socket.socketpair()
        out_read, out_write = os.pipe()
        err_read, err_write = os.pipe()
        try:
            pid = os.fork()
        except OSError as exc:
            control.send(json.dumps({"error": f"fork: {exc.strerror}"}).encode())
            pid = -1
        if pid == 0:
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                control.close()
                worker_end.close()
                os.close(out_read)
                os.close(err_read)
                os.dup2(out_write, 1)
                os.dup2(err_write, 2)
                _launch(libc, spawner, launch_end, request)
            finally:
                os._exit(SETUP_FAILED)
        if pid > 0:
            fds = [worker_end.fileno(), out_read, err_read]
            socket.send_fds(control, [json.dumps({"pid": pid}).encode()], fds)
        worker_end.close()
        launch_end.close()
        for fd in (out_read, out_write, err_read, err_write):
            os.close(fd)


if __name__ == "__main__":
    _serve(socket.socket(fileno=int(sys.argv[1])))
