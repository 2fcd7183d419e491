"""The shell text of a launch: the scripts its waiting processes run, and the lines a call
sends them (the folder, the limits, the variables, the command)."""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from worker.sandbox.config import COMMAND_ENV, SHELL

#: Reads a command line from standard input (the number of lines, then the lines; ``read``
#: takes a byte at a time, so what follows stays on the input) and runs it. Nothing to read (the
#: worker died, or let the launch go unused) ends it. The first process of a PID namespace whose
#: command has control groups is this script, and the line it reads is ``Plan.init_line``.
READ_AND_RUN = (
    'read -r n || exit 0; c=; while [ "$n" -gt 0 ]; do IFS= read -r l; c="$c$l\n"; '
    'n=$((n-1)); done; eval "$c"'
)
#: A bash init forks the command's process before the call comes: it takes SIGINT and SIGQUIT
#: back (bash lets a background job do so; dash does not), reads the call's line from the
#: socket (as fd 3: a background job's input is /dev/null) and runs it
#: (``Plan.init_line``). The init lets go of the command's output (bash would tell there how
#: the command ended), says it is ready, waits for it, then waits for the worker to close the
#: socket: the namespace lives on while the worker counts what the command left.
FORK_AHEAD = (
    "exec 3<&0; { trap - INT QUIT; "
    + READ_AND_RUN.replace("read -r", "read -r -u 3")
    + "; } & exec >/dev/null 2>&1; echo >&0; wait $!; read _"
)
#: The call's shell started ahead by the spawner (``Plan.shell_ahead``): it reads the call's line
#: from fd 3 (the socket), lets go of it, and runs the line itself; ``$0`` is the shell's path,
#: as in ``sh -c``. The line ends with the command's own text, run by ``eval``: the shell names
#: it in the messages of errors at the command's top level ("sh: 1: eval: x: not found").
SHELL_AHEAD = READ_AND_RUN.replace("read -r", "read -r <&3").replace(
    'eval "$c"', 'exec 3<&-; eval "$c"'
)

#: Run as root in a call's new mount namespace where no spawner makes it (``$1`` a size in bytes,
#: then (source, target) pairs of folders to bind (``Plan.private_binds``), then ``--`` and what
#: to run): /run, /tmp, /var/tmp and /dev/shm become empty file systems of the call's own, then
#: each source is bound at its target. The sources are bound aside, under the new /run, before
#: the folders above them are covered, then moved to their targets. A source that is a file (the
#: run's /etc/passwd) is bound over the file at its target. The call's IPC namespace holds
#: no more SysV shared memory than the call's memory limit (where the kernel lets the namespace's
#: root set it): even without a control group, its processes cannot pin more of it together.
#: The call's processes are the OOM killer's first choice (``launch.dies_first``).
PRIVATE_SCRIPT = (
    'size=$1; shift; o="nosuid,nodev,size=$size"; '
    'mount -t tmpfs -o "mode=0755,$o" tmpfs /run || exit 126; n=0; '
    'while [ "$1" != -- ]; do if [ -d "$1" ]; then mkdir "/run/.k$n"; else : >"/run/.k$n"; fi '
    '&& mount --bind "$1" "/run/.k$n" || exit 126; '
    'eval "k$n=\\$2"; n=$((n+1)); shift 2; done; shift; '
    "if [ -d /dev/mqueue ] && [ ! -L /dev/mqueue ]; then "
    "mount -t mqueue -o nosuid,nodev,noexec mqueue /dev/mqueue || exit 126; fi; "
    '{ echo "$size" >/proc/sys/kernel/shmmax; echo $((size / 4096)) >/proc/sys/kernel/shmall; '
    "echo 1000 >/proc/self/oom_score_adj; } 2>/dev/null; "
    'for d in /tmp /var/tmp /dev/shm; do if [ -d "$d" ] && [ ! -L "$d" ]; then '
    'mount -t tmpfs -o "mode=1777,$o" tmpfs "$d" || exit 126; fi; done; i=0; '
    'while [ $i -lt $n ]; do eval "k=\\$k$i"; { [ -e "$k" ] || mkdir -p "$k"; } && '
    'mount --move "/run/.k$i" "$k" && rm -d "/run/.k$i" || exit 126; i=$((i+1)); done; '
    'exec "$@"'
)
#: Still root, in the call's own mount namespace without a PID namespace: a /proc of its own
#: that shows each uid its own processes only (kernels from 5.8 keep each proc mount's options
#: apart). Its first argument is mount's path; the rest is the command.
HIDE_SCRIPT = (
    '"$1" -t proc -o nosuid,nodev,noexec,hidepid=invisible proc /proc || exit 126; shift; exec "$@"'
)
#: Still root, in the call's own mount namespace without the private folders: each (source,
#: target) pair of files bound (the run's /etc/passwd and /etc/group). Its first argument is
#: mount's path, then the pairs, then ``--`` and the command.
BIND_FILES_SCRIPT = (
    'm=$1; shift; while [ "$1" != -- ]; do "$m" --bind "$1" "$2" || exit 126; shift 2; done; '
    'shift; exec "$@"'
)
#: ``ulimit``'s flag and unit for each limit, in dash and in bash.
_DASH_ULIMITS = {"cpu": ("-t", 1), "fsize": ("-f", 512), "as": ("-v", 1024), "nproc": ("-p", 1)}
_BASH_ULIMITS = {"cpu": ("-t", 1), "fsize": ("-f", 1024), "as": ("-v", 1024), "nproc": ("-u", 1)}
#: A variable name a shell's ``export`` takes.
SHELL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def numbered(line: str) -> bytes:
    """``line`` as ``READ_AND_RUN`` reads it: the number of its lines, then its lines."""
    text = f"{line}\n"
    return f"{text.count(chr(10))}\n{text}".encode()


def ulimit_flags(limits: Mapping[str, tuple[int, int]], *, bash: bool) -> list[str]:
    """``limits`` as a shell's ``ulimit`` sets them: the soft one first, so that it is never
    above the hard one; address space in KiB, file sizes in dash's 512-byte blocks or bash's
    1024-byte ones, processes by dash's ``-p`` or bash's ``-u``."""
    units = _BASH_ULIMITS if bash else _DASH_ULIMITS
    found: list[str] = []
    for name, (soft, hard) in limits.items():
        flag, unit = units[name]
        found += [f"-S {flag} {soft // unit}", f"-H {flag} {hard // unit}"]
    return found


def shell_ahead_line(
    argv: Sequence[str], cwd: str, env: Mapping[str, str], ulimits: Sequence[str], env_binary: str
) -> str:
    """The line a shell started ahead (``SHELL_AHEAD``) runs for a call: the folder, the
    limits, the variables, then the command's text itself (a ``sh -c`` command line, run by
    this shell without starting another) or, for any other argv, its exec. The reader's own
    variables are unset first; variables a shell cannot export go through ``env_binary``."""
    exported = {name: value for name, value in env.items() if SHELL_NAME.fullmatch(name)}
    others = [f"{name}={value}" for name, value in env.items() if name not in exported]
    # The shell started with COMMAND_ENV: only what differs goes in the line.
    exported = {k: v for k, v in exported.items() if COMMAND_ENV.get(k) != v}
    exports = " ".join(f"{name}={shlex.quote(value)}" for name, value in exported.items())
    setup = "".join(f"ulimit {limit} || exit 126; " for limit in ulimits)
    export = f"export {exports}; " if exports else ""
    line = f"cd -P -- {shlex.quote(cwd)} || exit 126; {setup}{export}unset n c l"
    if not others and len(argv) == 3 and list(argv[:2]) == [SHELL, "-c"]:
        # On the same line: the command's own lines are numbered as under ``sh -c``.
        return f"{line}; {argv[2]}"
    if others:
        argv = [env_binary, "--", *others, *argv]
    return f"{line}; exec {shlex.join(argv)}"
