"""One run, one box: what a command of one run cannot do to another run, to the broker, to the
worker or to the host, tried as an attacker would, in each isolation mode this machine runs.

Modes: a root worker with namespaces (the default here), a root worker with
``TOOLQ_SANDBOX_ISOLATION=process`` (the command shares the worker's network, so the broker has a
password), and the deploy's sandbox pool: root inside a user namespace of its own with only the
capabilities deploy/ gives it (``tests/reliability/userns.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, wait_for
from tests.reliability.conftest import Run, Stack, start_stack
from tests.reliability.report import Report, Row
from tests.reliability.userns import deploy_like_stack, userns_unavailable
from worker.contract.fleet_secret import SECRET_SETTING, fleet_secret
from worker.retention import Expired, prune
from worker.sandbox.volumes import volumes_unavailable

pytestmark = pytest.mark.integration

SECRET = f"toolq-run-secret-{secrets.token_hex(8)}"
WORKER_SECRET = f"toolq-worker-secret-{secrets.token_hex(8)}"
MODES = ("namespaces", "process", "deploy")
QUOTA_MB = 32


@pytest.fixture(scope="module", params=MODES)
def mode_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Stack]]:
    mode: str = request.param
    if os.geteuid() != 0:
        pytest.skip("per-run uids need a root worker (or root in a user namespace)")
    password = secrets.token_hex(16)
    env = {"WORKER_TEST_SECRET": WORKER_SECRET}
    if mode == "deploy":
        reason = userns_unavailable()
        if reason is not None:
            pytest.skip(reason)
        # Outside pytest's folder, which only its own user may pass through.
        workdir = Path(tempfile.mkdtemp(prefix="toolq-deploy-like-"))
        try:
            stack = deploy_like_stack(workdir, password=password, env=env)
            yield mode, stack
            stack.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return
    isolation = "namespaces" if mode == "namespaces" else "process"
    workdir = tmp_path_factory.mktemp(f"apart-{mode}")
    stack = start_stack(workdir, env=env, redis_password=password, sandbox_isolation=isolation)
    yield mode, stack
    stack.stop()


@dataclass
class Runs:
    """Two runs on one fleet, an attacker and its victim, and the report their cases go to."""

    mode: str
    attacker: Run
    victim: Run
    report: Report

    def case(self, tried: str, expected: str) -> contextlib.AbstractContextManager[Row]:
        """A row of the report's isolation cases, tried in this fleet's isolation mode."""
        return self.report.case("Isolation", f"[{self.mode}] {tried}", expected)


@pytest.fixture
async def runs(mode_stack: tuple[str, Stack], report: Report) -> AsyncIterator[Runs]:
    mode, stack = mode_stack
    async with Dispatcher(stack.settings) as dispatcher:
        victim = Caller(dispatcher, stack.settings, f"victim-{secrets.token_hex(4)}")
        attacker = Caller(dispatcher, stack.settings, f"attacker-{secrets.token_hex(4)}")
        yield Runs(mode, Run(attacker, stack), Run(victim, stack), report)


async def test_a_run_cannot_see_read_or_write_another_runs_files(runs: Runs) -> None:
    attacker, victim = runs.attacker, runs.victim
    with runs.case(
        "run X: `ls ..`, `cat ../Y/secret.txt` (chmod 600, and 644), "
        "`echo x > ../Y/planted.txt`, `ls -a ../Y`",
        "Y's name, files and secret never shown; nothing planted in Y's workspace",
    ) as row:
        made = await victim.bash(
            f"echo {SECRET} > secret.txt && chmod 600 secret.txt && "
            f"echo {SECRET} > open.txt && chmod 644 open.txt; chmod 755 ."
        )
        assert "Operation not permitted" in made["stderr"], made
        victim_name = victim.caller.run_id
        answer = await attacker.bash(
            f"ls -a ..; cat ../{victim_name}/secret.txt ../{victim_name}/open.txt; "
            f"echo x > ../{victim_name}/planted.txt; ls -a ../{victim_name}; "
            "find / -name secret.txt 2>/dev/null | head; true"
        )
        shown = answer["stdout"] + answer["stderr"]
        row.observed = (
            f"exit {answer['exit_code']}; Y's name shown: {victim_name in answer['stdout']}; "
            f"secret shown: {SECRET in shown}; planted: "
            f"{(victim.workspace / 'planted.txt').exists()}"
        )
        assert SECRET not in shown
        assert victim_name not in answer["stdout"]
        assert not (victim.workspace / "planted.txt").exists()
        # The victim's `chmod 755 .` was refused: the folder is the worker's, in the run's group.
        folder = victim.workspace.stat()
        assert folder.st_gid != attacker.workspace.stat().st_gid
        assert folder.st_mode & 0o777 == 0o770


async def test_tmp_is_the_runs_own_and_gone_with_its_workspace(runs: Runs) -> None:
    attacker, victim = runs.attacker, runs.victim
    token = secrets.token_hex(6)
    files = (f"/tmp/x-{token}", f"/dev/shm/x-{token}")
    with runs.case(
        "run X writes 8 MiB to /tmp/x-<token> and /dev/shm/x-<token>; run Y reads "
        "them; X's workspace is removed",
        "Y reads nothing; X's next call finds its /tmp file; once X's workspace is removed, "
        "nothing of X's is left on the host",
    ) as row:
        wrote = await attacker.bash(
            " && ".join(f"head -c 8388608 /dev/zero > {path}" for path in files)
        )
        assert wrote["exit_code"] == 0, wrote
        read = await victim.bash(f"wc -c {' '.join(files)}")
        again = await attacker.bash(f"wc -c < {files[0]}")
        root = attacker.workspace.parent
        tried: list[Expired] = []

        def removed() -> bool:
            # Removal waits for any call of the run still holding its workspace.
            tried.extend(prune(root, 0.0))
            return any(e.removed and e.run_id == attacker.caller.run_id for e in tried)

        wait_for(removed, what=f"X's workspace to be removed (tried: {tried})")
        left = [path for path in files if os.path.exists(path)]
        left += [str(p) for p in (root / ".toolq" / "tmp").glob(f"{attacker.caller.run_id}*")]
        row.observed = (
            f"Y's read: exit {read['exit_code']}; X's next call read "
            f"{again['stdout'].strip()} bytes; left after removal: {left or 'none'}"
        )
        assert read["exit_code"] != 0
        assert "8388608" not in read["stdout"]
        assert again["stdout"].strip() == "8388608", again
        assert left == []


async def test_nothing_of_a_run_outlives_its_call(runs: Runs) -> None:
    attacker = runs.attacker
    with runs.case(
        "`env -u TOOLQ_SANDBOX_ID setsid sh -c 'sleep 300' &`, `nohup`, a double "
        "fork, then the call ends",
        "no process of the run's uid is left",
    ) as row:
        answer = await attacker.bash(
            "env -u TOOLQ_SANDBOX_ID setsid sh -c 'sleep 301' >/dev/null 2>&1 & "
            "nohup sleep 302 >/dev/null 2>&1 & (sh -c 'sleep 303 &' &); echo started"
        )
        assert answer["stdout"].strip() == "started", answer
        uid = attacker.workspace.stat().st_gid  # the run's uid and gid are one number
        # The run's own: the sandbox keeps a shell of the run's uid waiting for its next call.
        wait_for(lambda: not _processes_of(uid, "sleep 30"), what="the run's processes to go")
        row.observed = f"{len(_processes_of(uid, 'sleep 30'))} process(es) of the command left"


async def test_the_worker_and_its_secrets_are_out_of_reach(runs: Runs) -> None:
    attacker = runs.attacker
    workers = attacker.stack.fleet.worker_pids("sandbox")
    listed = " ".join(map(str, workers))
    with runs.case(
        "run_bash reads /proc/<worker pid>/environ and sends `kill -9` to every "
        "sandbox worker process",
        "no secret read; every worker process lives on",
    ) as row:
        answer = await attacker.bash(
            f"for p in {listed}; do cat /proc/$p/environ; kill -9 $p; done; true"
        )
        shown = answer["stdout"] + answer["stderr"]
        alive = [pid for pid in workers if _alive(pid)]
        row.observed = f"secret shown: {WORKER_SECRET in shown}; {len(alive)}/{len(workers)} alive"
        assert WORKER_SECRET not in shown
        assert alive == workers


def _worker_variable(pid: int, name: str) -> str:
    """``name``'s value in the environment of process ``pid`` (read as root)."""
    for item in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
        key, _, value = item.decode(errors="replace").partition("=")
        if key == name:
            return value
    raise AssertionError(f"process {pid} has no {name}")


async def test_the_fleet_secret_that_seals_answers_is_out_of_reach(runs: Runs) -> None:
    attacker = runs.attacker
    stack = attacker.stack
    [worker, *_] = stack.fleet.worker_pids("sandbox")
    path = _worker_variable(worker, SECRET_SETTING)
    secret = fleet_secret(stack.settings.fleet_secret_file).value.decode()
    half = len(secret) // 2
    # The file read, and the secret looked for in every environment and command line the
    # command can read; the pattern is put together in a file, so no command line holds it.
    search = (
        f"cat {path} {Path(path).parent}/* 2>&1; "
        f"printf '%s%s' '{secret[:half]}' '{secret[half:]}' > pattern; "
        "grep -l -F -f pattern /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null; true"
    )
    with runs.case(
        "run_bash reads the sandbox worker's fleet secret file (TOOLQ_FLEET_SECRET_FILE, "
        "which seals every answer) and looks for the secret in every /proc/*/environ and "
        "cmdline it can read",
        "not read, found nowhere: no answer can be sealed from a run",
    ) as row:
        answer = await attacker.bash(search)
        shown = answer["stdout"] + answer["stderr"]
        found = [line for line in answer["stdout"].splitlines() if line.startswith("/proc/")]
        row.observed = f"secret shown: {secret in shown}; found in: {found or 'none'}"
        assert secret not in shown
        assert found == []


async def test_the_broker_is_out_of_reach(runs: Runs) -> None:
    attacker = runs.attacker
    stack = attacker.stack
    port = stack.redis.port
    probe = (
        "import socket\n"
        "try:\n"
        f"    s = socket.create_connection(('127.0.0.1', {port}), timeout=3)\n"
        "    s.sendall(b'KEYS *\\r\\n')\n"
        "    print('answer:', s.recv(200))\n"
        "except OSError as e:\n"
        "    print('refused:', e)\n"
    )
    password = stack.redis.password or ""
    half = len(password) // 2
    # The password looked for in every command line and environment the command can read; the
    # pattern is put together in a file, so that no command line of the search holds it.
    search = (
        f"printf '%s%s' '{password[:half]}' '{password[half:]}' > pattern; "
        "grep -l -F -f pattern /proc/[0-9]*/cmdline /proc/[0-9]*/environ 2>/dev/null; true"
    )
    with runs.case(
        "run_bash connects to the broker's port and sends `KEYS *`; looks for the "
        "broker's password in every /proc/*/cmdline and environ it can read",
        "no connection (no network), or NOAUTH; the password found nowhere",
    ) as row:
        answer = await attacker.bash(f'python3 -c "{probe}"')
        found = await attacker.bash(search)
        out = answer["stdout"]
        where = found["stdout"].split() or "none"
        row.observed = f"{out.strip()[:100]}; password found in: {where}"
        assert out.startswith("refused:") or "NOAUTH" in out, answer
        assert found["stdout"].strip() == "", found


async def test_host_sockets_are_out_of_reach_with_namespaces(runs: Runs, tmp_path: Path) -> None:
    if runs.mode == "process":
        pytest.skip("without namespaces the command shares the host's sockets by design")
    paths = [
        f"/run/toolq-test-{secrets.token_hex(4)}.sock",
        f"/tmp/toolq-test-{secrets.token_hex(4)}.sock",
    ]
    listeners = [_listen(path) for path in paths]
    probe = "; ".join(
        f"python3 -c \"import socket; s=socket.socket(socket.AF_UNIX); s.connect('{path}'); "
        f"print('connected {path}')\" 2>/dev/null"
        for path in paths
    )
    try:
        with runs.case(
            "run_bash connects to a host Unix socket in /run and in /tmp",
            "neither is there (the call's /run and /tmp are its own)",
        ) as row:
            answer = await runs.attacker.bash(probe + "; true")
            row.observed = answer["stdout"].strip() or "no connection"
            assert "connected" not in answer["stdout"]
    finally:
        for listener, path in zip(listeners, paths, strict=True):
            listener.close()
            os.unlink(path)


async def test_read_file_refuses_a_hard_link_to_a_file_the_run_does_not_own(
    runs: Runs, tmp_path: Path
) -> None:
    attacker = runs.attacker
    await attacker.bash("true")  # the workspace exists
    outside = tmp_path / "host-secret.txt"
    outside.write_text(SECRET)
    outside.chmod(0o600)
    os.link(outside, attacker.workspace / "linked.txt")
    with runs.case(
        "read_file of a hard link in the workspace to a host file (root's, 0600)",
        "refused, the content not shown",
    ) as row:
        result = await attacker.caller("read_file", {"path": "linked.txt"})
        row.observed = result.output[:120]
        assert result.is_error
        assert SECRET not in result.output
        # In the deploy, the file is the host's root's, beyond even the namespace's root.
        assert "hard link" in result.output or (runs.mode == "deploy" and "denied" in result.output)


async def test_parallel_calls_of_one_run_keep_their_processes(runs: Runs) -> None:
    """A run's calls may overlap (parallel tool calls): the end of one does not kill the other's
    processes, though both run as the run's uid."""
    attacker = runs.attacker
    with runs.case(
        "two calls of one run at once; the short one ends first",
        "the long one's command finishes",
    ) as row:
        long_call = asyncio.create_task(attacker.bash("sleep 2; echo long done"))
        short = await attacker.bash("echo short done")
        done = await long_call
        row.observed = f"{short['stdout'].strip()}; {done['stdout'].strip()}"
        assert done["stdout"].strip() == "long done", done


def _processes_of(uid: int, running: str) -> list[int]:
    """The processes of ``uid`` whose command line holds ``running``."""
    found = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat(follow_symlinks=False).st_uid != uid:
                    continue
                cmdline = Path(entry.path, "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if running.encode() in cmdline:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _listen(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    os.chmod(path, 0o777)
    server.listen()
    threading.Thread(target=_accept_all, args=(server,), daemon=True).start()
    return server


def _accept_all(server: socket.socket) -> None:
    while True:  # bound: a daemon thread, ended by the server socket closing
        try:
            conn, _ = server.accept()
        except OSError:
            return
        conn.close()


@pytest.fixture(scope="module")
def volume_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A root fleet whose runs' workspaces are file systems of the quota's size."""
    reason = volumes_unavailable()
    if reason is not None:
        pytest.skip(f"no run volumes here: {reason}")
    stack = start_stack(
        tmp_path_factory.mktemp("apart-volumes"),
        workspace_quota_bytes=QUOTA_MB << 20,
        workspace_quota_fs="loop",
    )
    yield stack
    prune(stack.workspace_root, 0.0)
    stack.stop()


async def test_no_call_writes_past_the_quota(volume_stack: Stack, report: Report) -> None:
    async with Dispatcher(volume_stack.settings) as dispatcher:
        run = Run(
            Caller(dispatcher, volume_stack.settings, f"fills-{secrets.token_hex(4)}"), volume_stack
        )
        with report.case(
            "Isolation",
            f"[namespaces, TOOLQ_WORKSPACE_QUOTA_FS=loop] one call writes 60 MB into a workspace "
            f"whose quota is {QUOTA_MB} MiB",
            "the kernel stops the write at the quota ('No space left on device')",
        ) as row:
            answer = await run.bash("head -c 62914560 /dev/zero > big; echo wrote $?")
            size = (run.workspace / "big").stat().st_size
            row.observed = f"{size / 2**20:.1f} MiB written; {answer['stderr'].strip()[:80]}"
            assert "No space left on device" in answer["stderr"]
            assert size < QUOTA_MB << 20
