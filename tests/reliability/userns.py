"""The deploy's pools on this machine: workers that are root only inside a user namespace of
their own (as pods with ``hostUsers: false``), with only the capabilities deploy/ gives the
sandbox pool.

Each namespace maps its root to an unprivileged uid of the host (``OUTER_ROOT``) and the runs'
uid range onto itself, so both pools see a run's files as one owner, as an idmapped volume shows
them to two pods. No control group of the host can be written from them: the sandbox falls back
to rlimits there, as it would in such a pod.

Run as a program, this module is the namespace's launcher: ``python -m tests.reliability.userns
-- argv...`` starts ``argv`` as the namespace's root under the deploy's capability set.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import redis

from api.local.stack import worker_argv, worker_environment
from tests.conftest import REPO, RedisServer, WorkerFleet, fleet_settings, wait_for
from tests.reliability import delegated
from tests.reliability.conftest import Stack, variables_set
from worker.contract.fleet_secret import SECRET_SETTING, fleet_secret
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.contract.wire import POOLS

#: The host uid the namespace's root is.
OUTER_ROOT = 1_990_000_000
#: How long a worker may take to announce itself on a busy machine.
START_BOUND_S = 120.0
#: The capabilities deploy/k8s/worker-sandbox.yaml adds (all others dropped).
DEPLOY_CAPABILITIES = ("setuid", "setgid", "chown", "fowner", "kill", "sys_admin", "dac_override")
#: The launcher's flag that gives the worker control groups of its own (``delegated``).
DELEGATE_FLAG = "--delegate-cgroups"
_CLONE_NEWUSER, _CLONE_NEWNS = 0x10000000, 0x00020000
_MS_BIND, _MS_REC, _MS_PRIVATE, _O_PATH = 4096, 1 << 14, 1 << 18, 0o10000000


def userns_unavailable() -> str | None:
    """Why the deploy-like worker cannot run here, or None."""
    if os.geteuid() != 0:
        return "making a user namespace with a mapped range needs root"
    if closed := _closed_folder_above(REPO):
        # The workers run this checkout's .venv as a mapped uid, which cannot pass through it.
        return f"this checkout is behind {closed}, a folder others cannot pass through (chmod o+x)"
    probe = subprocess.run(
        [sys.executable, "-m", "tests.reliability.userns", "--", "/bin/true"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    if probe.returncode != 0:
        return f"no user namespace here: {probe.stderr.strip()[:200]}"
    return None


class DeployLikeFleet(WorkerFleet):
    """Both pools as the deploy runs them: each worker root only in a user namespace of its own
    (two pods), the namespaces mapping alike, so both see the runs' files as one owner."""

    def __init__(
        self, settings: WorkerSettings, workdir: Path, *, delegate_cgroups: bool = False
    ) -> None:
        super().__init__(settings)
        self._workdir = workdir
        #: The sandbox pool gets a control group of its own, as a pod a runtime delegates one to.
        self._delegate = delegate_cgroups
        self._workers: dict[str, subprocess.Popen[bytes]] = {}

    def start(self) -> DeployLikeFleet:
        # Its temporary folder, where its commands' input waits, is the namespace root's.
        tmp = self._workdir / "worker-tmp"
        tmp.mkdir(exist_ok=True)
        os.chown(tmp, OUTER_ROOT, OUTER_ROOT)
        env = {
            **os.environ,
            **worker_environment(self.settings),
            "TMPDIR": str(tmp),
            "PYTHONPATH": str(REPO),
            # The callers' fleet secret, as a pod has it: a file of the namespace root's own.
            SECRET_SETTING: str(self._secret_copy()),
        }
        for pool in POOLS:
            argv = worker_argv(pool, node=f"{pool}-userns@%h", concurrency=2, loglevel="WARNING")
            log = (self._workdir / f"{pool}.log").open("ab")
            self._workers[pool] = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.userns", *self._flags(pool), "--", *argv],
                cwd=REPO,
                env=env,
                stdout=log,
                stderr=log,
            )
            log.close()
        client = redis.Redis.from_url(self.settings.redis_url)
        try:
            for pool in POOLS:
                wait_for(
                    lambda p=pool: self._announced(client, p),  # type: ignore[misc]
                    timeout=START_BOUND_S,
                    what=f"the {pool} worker",
                )
        finally:
            client.close()
        return self

    def _secret_copy(self) -> Path:
        """The fleet secret of this process (the callers'), copied for the namespace root, which
        cannot read this user's own (``TOOLQ_FLEET_SECRET_FILE``)."""
        secret = fleet_secret(self.settings.fleet_secret_file)
        folder = self._workdir / "fleet"
        folder.mkdir(mode=0o700, exist_ok=True)
        copy = folder / "fleet-secret"
        copy.write_bytes(secret.value)
        copy.chmod(0o600)
        for path in (folder, copy):
            os.chown(path, OUTER_ROOT, OUTER_ROOT)
        return copy

    def _flags(self, pool: str) -> list[str]:
        return [DELEGATE_FLAG] if self._delegate and pool == "sandbox" else []

    def _announced(self, client: redis.Redis, pool: str) -> bool:
        if self._workers[pool].poll() is not None:
            raise RuntimeError(f"the {pool} worker exited:\n{self.log(pool)}")
        pids = set(self.worker_pids(pool))
        for key in client.scan_iter(keys.worker_heartbeats(pool)):
            info = client.get(key)
            if info and json.loads(info).get("pid") in pids:
                return True
        return False

    def log(self, pool: str, lines: int = 200) -> str:
        text = (self._workdir / f"{pool}.log").read_text(errors="replace")
        return "\n".join(text.splitlines()[-lines:])

    def worker_pids(self, pool: str) -> list[int]:
        """The worker's processes: the launcher's descendants (the launcher is the host's)."""
        found, pending = [], [self._workers[pool].pid]
        while pending:
            pid = pending.pop()
            try:
                tasks = list(Path(f"/proc/{pid}/task").iterdir())
            except OSError:
                continue  # it ended since its parent listed it (a start's short-lived helper)
            for task in tasks:
                try:
                    children = [int(p) for p in (task / "children").read_text().split()]
                except OSError:
                    continue
                found += children
                pending += children
        return found

    def stop(self) -> None:
        for worker in self._workers.values():
            worker.send_signal(signal.SIGTERM)
        for worker in self._workers.values():
            try:
                worker.wait(15)
            except subprocess.TimeoutExpired:
                worker.kill()
                worker.wait(timeout=30)


def deploy_like_stack(
    workdir: Path,
    *,
    password: str,
    env: dict[str, str],
    delegate_cgroups: bool = False,
    **overrides: object,
) -> Stack:
    """A private Redis with a password and both pools as the deploy runs them, with settings
    ``overrides``. Their folders are below ``workdir``, which must be a folder others may pass
    through (not pytest's, which is its user's alone)."""
    os.chmod(workdir, 0o711)
    root = workdir / "workspaces"
    root.mkdir(parents=True)
    # The namespaces' root owns the workspaces, as the pods' root owns their volume.
    os.chown(root, OUTER_ROOT, OUTER_ROOT)
    # The host's registry of a pod is its own /run: one of the namespace root's.
    host_state = workdir / "host-state"
    host_state.mkdir(mode=0o700)
    os.chown(host_state, OUTER_ROOT, OUTER_ROOT)
    server = RedisServer(workdir, password=password)
    server.start()
    settings = fleet_settings(
        server.url,
        root,
        **{"sandbox_isolation": "namespaces", "sandbox_host_state": host_state, **overrides},
    )
    fleet = DeployLikeFleet(settings, workdir, delegate_cgroups=delegate_cgroups)
    try:
        with variables_set(env):
            fleet.start()
    except BaseException:
        fleet.stop()
        server.stop()
        raise
    return Stack(server, fleet)


def _enter(argv: list[str], delegate_cgroups: bool) -> None:
    """Fork a child into a new user and mount namespace, map it, and exec ``argv`` there as
    root under the deploy's capabilities (with ``delegate_cgroups``, in control groups of its
    own: ``delegated``); wait for it, passing SIGTERM on."""
    libc = ctypes.CDLL(None, use_errno=True)
    ready_r, ready_w = os.pipe()
    mapped_r, mapped_w = os.pipe()
    child = os.fork()
    if child == 0:
        os.close(ready_r)
        os.close(mapped_w)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG: dies with the launcher
        # The mount namespace first, while still the host's root: the interpreter may lie below
        # a folder closed to others (root's home), which the namespace then sees as an empty
        # one of its own with the interpreter bound back.
        if libc.unshare(_CLONE_NEWNS) != 0:
            os._exit(125)
        _show_the_interpreter(libc)
        if libc.unshare(_CLONE_NEWUSER) != 0:
            os.write(2, f"unshare: {os.strerror(ctypes.get_errno())}\n".encode())
            os._exit(125)
        os.write(ready_w, b"1")
        if os.read(mapped_r, 1) != b"1":
            os._exit(125)
        os.setgid(0)
        os.setgroups([])
        os.setuid(0)
        caps = ",".join(["-all", *(f"+{cap}" for cap in DEPLOY_CAPABILITIES)])
        os.execvp("setpriv", ["setpriv", f"--bounding-set={caps}", "--no-new-privs", "--", *argv])
    os.close(ready_w)
    os.close(mapped_r)
    if os.read(ready_r, 1) != b"1":
        os._exit(125)
    groups = delegated.delegate(child, OUTER_ROOT) if delegate_cgroups else []
    runs = UidRange.parse(DEFAULT_UID_RANGE)
    mapping = f"0 {OUTER_ROOT} 1\n{runs.first} {runs.first} {runs.size}\n"
    Path(f"/proc/{child}/uid_map").write_text(mapping)
    Path(f"/proc/{child}/gid_map").write_text(mapping)
    os.write(mapped_w, b"1")
    signal.signal(signal.SIGTERM, lambda *_: os.kill(child, signal.SIGTERM))
    signal.signal(signal.SIGINT, lambda *_: os.kill(child, signal.SIGINT))
    while True:
        try:
            _, status = os.waitpid(child, 0)  # bound: the test ends the worker (kill at 15 s)
            break
        except InterruptedError:
            continue
    delegated.remove(groups)
    os._exit(os.waitstatus_to_exitcode(status) & 0xFF)


def _show_the_interpreter(libc: ctypes.CDLL) -> None:
    hidden, python = _python_behind_a_closed_folder()
    if hidden is None:
        return
    _mount(libc, b"none", b"/", None, None, _MS_REC | _MS_PRIVATE)
    python_fd = os.open(python, _O_PATH | os.O_DIRECTORY)
    _mount(libc, b"tmpfs", hidden.encode(), b"tmpfs", b"mode=0755", 0)
    os.makedirs(python, exist_ok=True)
    _mount(libc, f"/proc/self/fd/{python_fd}".encode(), python.encode(), None, None, _MS_BIND)
    os.close(python_fd)


def _python_behind_a_closed_folder() -> tuple[str | None, str]:
    """The first folder above this interpreter's installation that others cannot pass through
    (None if there is none), and the installation's folder."""
    python = os.path.realpath(sys.base_prefix)
    return _closed_folder_above(Path(python)), python


def _closed_folder_above(path: Path) -> str | None:
    """The first folder from the root down to ``path`` that others cannot pass through."""
    parts = Path(os.path.realpath(path)).parts
    for depth in range(2, len(parts) + 1):
        folder = os.path.join(*parts[:depth])
        if not os.stat(folder).st_mode & 0o001:
            return folder
    return None


def _mount(
    libc: ctypes.CDLL,
    source: bytes,
    target: bytes,
    kind: bytes | None,
    data: bytes | None,
    flags: int,
) -> None:
    if libc.mount(source, target, kind, flags, data) != 0:
        raise OSError(ctypes.get_errno(), f"mount {target.decode()}")


if __name__ == "__main__":
    given = sys.argv[1:]
    delegate = given[:1] == [DELEGATE_FLAG]
    given = given[1:] if delegate else given
    if given[:1] != ["--"]:
        sys.exit(f"usage: python -m tests.reliability.userns [{DELEGATE_FLAG}] -- argv...")
    _enter(given[1:], delegate)
