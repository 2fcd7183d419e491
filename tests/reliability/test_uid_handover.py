"""Nothing of a run outlives it, and its memory limit is the call's: tried as an attacker would,
in each isolation mode this machine runs (those of ``test_runs_apart``).

Each fleet here has a uid range of one uid, so every run is given the same uid: a run plants
what the kernel keeps for a uid (keys, SysV shared memory and messages, a POSIX message queue, a
file in /run/lock), its workspace is removed, and the next run, given that uid, looks for them.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, wait_for
from tests.reliability.conftest import Stack, start_stack
from tests.reliability.report import Report, Row
from tests.reliability.userns import deploy_like_stack, userns_unavailable
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.retention import Expired, prune
from worker.sandbox.host_registry import HostRegistry, default_host_state

pytestmark = pytest.mark.integration

#: Those of ``test_runs_apart``, and the deploy's sandbox pool in a pod given a control group of
#: its own (as a runtime that delegates one would: ``tests/reliability/delegated.py``).
MODES = ("namespaces", "process", "deploy", "deploy-delegated")
SECRET = f"toolq-left-{secrets.token_hex(8)}"
#: The calls' memory limit, and what the attacks hold: each part under it, together over it.
MEMORY_MB = 64
SEGMENT_MB = 40
HOG_MB = 24
HOGS = 4

#: Plants, as the run's uid, one of each thing the kernel keeps for a uid, holding $1.
PLANT = r"""
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
secret = sys.argv[1].encode()
done = []
for name, ring in (("user", -4), ("user-session", -5)):
    key = libc.syscall(L(248), b"user", b"toolq-planted", secret, L(len(secret)), L(ring))
    done.append(f"key in {name}: {key >= 0}")
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x70011, 4096, 0o1000 | 0o600)
if shm >= 0:
    address = libc.shmat(shm, None, 0)
    ctypes.memmove(address, secret, len(secret))
    libc.shmdt(ctypes.c_void_p(address))
done.append(f"shm: {shm >= 0}")
msq = libc.msgget(0x70012, 0o1000 | 0o600)
message = (1).to_bytes(8, "little") + secret
done.append(f"msg: {msq >= 0 and libc.msgsnd(msq, message, len(secret), 0) == 0}")
mqd = libc.mq_open(b"/toolq-planted", os.O_CREAT | os.O_RDWR, 0o600, None)
done.append(f"mqueue: {mqd >= 0 and libc.mq_send(mqd, secret, len(secret), 0) == 0}")
try:
    with open("/run/lock/toolq-planted", "wb") as lock:
        lock.write(secret)
    done.append("run-lock: True")
except OSError as exc:
    done.append(f"run-lock: False ({exc.strerror})")
print("; ".join(done))
"""

#: Looks, as the run's uid, for what ``PLANT`` left; prints what it found.
FIND = r"""
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
L = ctypes.c_long
found = []
for ring in (-4, -5, -3):
    key = libc.syscall(L(250), L(10), L(ring), b"user", b"toolq-planted", L(0))
    if key >= 0:
        buffer = ctypes.create_string_buffer(256)
        size = libc.syscall(L(250), L(11), L(key), buffer, L(256))
        found.append(f"key {ring}: {buffer.raw[:max(size, 0)]!r}")
libc.shmat.restype = ctypes.c_void_p
shm = libc.shmget(0x70011, 0, 0)
if shm >= 0:
    address = libc.shmat(shm, None, 0o10000)
    found.append(f"shm: {ctypes.string_at(address, 64)!r}" if address != 2**64 - 1 else "shm")
msq = libc.msgget(0x70012, 0)
if msq >= 0:
    buffer = ctypes.create_string_buffer(264)
    size = libc.msgrcv(msq, buffer, 256, 0, 0o4000)
    found.append(f"msg: {buffer.raw[8:8 + max(size, 0)]!r}")
mqd = libc.mq_open(b"/toolq-planted", os.O_RDONLY | os.O_NONBLOCK)
if mqd >= 0:
    buffer = ctypes.create_string_buffer(8192)
    size = libc.mq_receive(mqd, buffer, 8192, None)
    found.append(f"mqueue: {buffer.raw[:max(size, 0)]!r}")
try:
    found.append(f"run-lock: {open('/run/lock/toolq-planted', 'rb').read()!r}")
except OSError:
    pass
print(repr(found))
"""

#: Makes a SysV shared memory segment of $1 MiB, touches every page, and leaves it there.
SEGMENT = r"""
import ctypes, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.shmat.restype = ctypes.c_void_p
size = int(sys.argv[1]) << 20
shm = libc.shmget(0, size, 0o1000 | 0o600)
address = libc.shmat(shm, None, 0)
if shm < 0 or address == 2**64 - 1:
    sys.exit(f"no segment: errno {ctypes.get_errno()}")
ctypes.memset(address, 1, size)
libc.shmdt(ctypes.c_void_p(address))
print("left", shm, "in", __import__("os").readlink("/proc/self/ns/ipc"))
"""

#: One of several processes: holds $1 MiB, says so in a file, and waits (bounded) until $2 live
#: processes hold theirs at once; once one of them is gone (the limit stopped it), they never
#: will, and it stops waiting.
HOG = r"""
import glob, os, sys, time
open(f"started-{os.getpid()}", "w").close()
held = bytearray(int(sys.argv[1]) << 20)
for at in range(0, len(held), 4096):
    held[at] = 1
open(f"held-{os.getpid()}", "w").close()

def alive(pattern):  # how many of the processes that wrote such a file still live
    count = 0
    for name in glob.glob(pattern):
        try:
            os.kill(int(name.split("-")[1]), 0)
            count += 1
        except ProcessLookupError:
            pass
    return count

until = time.monotonic() + 10
while alive("held-*") < int(sys.argv[2]) and time.monotonic() < until:
    if alive("started-*") < len(glob.glob("started-*")):
        break
    time.sleep(0.05)
print("all held" if alive("held-*") >= int(sys.argv[2]) else "alone")
"""


@dataclass
class Fleet:
    """A fleet whose runs all get ``uid``, and the report its cases go to."""

    mode: str
    stack: Stack
    uid: int
    report: Report

    def case(self, tried: str, expected: str) -> contextlib.AbstractContextManager[Row]:
        """A row of the report's isolation cases, tried in this fleet's mode."""
        return self.report.case("Isolation", f"[{self.mode}] {tried}", expected)


def _unheld_uid() -> int:
    """One uid of the range the deploy-like namespaces map that no fleet on this host holds: the
    fleets of other tests, and of other suites whose workspaces pytest keeps, hold theirs."""
    default = UidRange.parse(DEFAULT_UID_RANGE)
    host = HostRegistry(default_host_state())
    for _ in range(100):
        uid = default.first + default.size - 1 - secrets.randbelow(default.size // 2)
        if host.uid_holder(uid) is None:
            return uid
    pytest.fail(f"no uid of {DEFAULT_UID_RANGE}'s upper half free on this host in 100 tries")


@pytest.fixture(scope="module", params=MODES)
def one_uid_stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[str, Stack, int]]:
    """A fleet whose runs all get one uid, with calls limited to ``MEMORY_MB``."""
    mode: str = request.param
    if os.geteuid() != 0:
        pytest.skip("per-run uids need a root worker (or root in a user namespace)")
    uid = _unheld_uid()
    if mode.startswith("deploy"):
        reason = userns_unavailable()
        if reason is not None:
            pytest.skip(reason)
        workdir = Path(tempfile.mkdtemp(prefix="toolq-handover-"))
        try:
            stack = deploy_like_stack(
                workdir,
                password=secrets.token_hex(16),
                env={},
                sandbox_uid_range=f"{uid}-{uid}",
                sandbox_memory_mb=MEMORY_MB,
                delegate_cgroups=mode == "deploy-delegated",
            )
            yield mode, stack, uid
            stack.stop()
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        return
    workdir = tmp_path_factory.mktemp(f"handover-{mode}")
    stack = start_stack(
        workdir,
        sandbox_isolation=mode,
        sandbox_uid_range=f"{uid}-{uid}",
        sandbox_memory_mb=MEMORY_MB,
    )
    yield mode, stack, uid
    stack.stop()


@pytest.fixture
async def fleet(
    one_uid_stack: tuple[str, Stack, int], report: Report
) -> AsyncIterator[tuple[Fleet, Dispatcher]]:
    mode, stack, uid = one_uid_stack
    async with Dispatcher(stack.settings) as dispatcher:
        yield Fleet(mode, stack, uid, report), dispatcher


async def _bash(caller: Caller, command: str) -> dict[str, Any]:
    result = await caller("run_bash", {"command": command, "timeout": 15_000})
    assert not result.is_error, result.output
    answer: dict[str, Any] = json.loads(result.output)
    return answer


def _with_script(name: str, text: str, run: str) -> str:
    """A command that writes ``text`` to ``name`` in the workspace, then runs ``run``."""
    return f"cat > {name} <<'TOOLQ_EOF'\n{text}\nTOOLQ_EOF\n{run}"


def _python(script: str) -> str:
    """Runs ``script`` of the workspace: by its text, as the folders above the workspace may be
    closed to the run's uid (Python opens a script by its full path)."""
    return f'python3 -c "$(cat {script})"'


def _remove(root: Path, run_id: str) -> None:
    tried: list[Expired] = []

    def removed() -> bool:
        # Removal waits for any call of the run still holding its workspace.
        tried.extend(prune(root, 0.0))
        return any(e.removed and e.run_id == run_id for e in tried)

    wait_for(removed, what=f"{run_id}'s workspace to be removed (tried: {tried})")


def _segments_of(uid: int) -> list[str]:
    """The SysV shared memory segments the host's IPC namespace holds for ``uid``."""
    lines = Path("/proc/sysvipc/shm").read_text().splitlines()
    names = lines[0].split()
    rows = [dict(zip(names, line.split(), strict=False)) for line in lines[1:]]
    return [f"{row['shmid']} ({row['size']} B)" for row in rows if int(row["uid"]) == uid]


async def test_a_uid_handed_to_another_run_carries_nothing_of_the_last(
    fleet: tuple[Fleet, Dispatcher],
) -> None:
    box, dispatcher = fleet
    settings = box.stack.settings
    leaver = Caller(dispatcher, settings, f"leaver-{secrets.token_hex(4)}")
    with box.case(
        "run X (the range's only uid) adds a key to its user and user-session keyrings, "
        "makes a 0600 SysV shm segment and message queue, a POSIX message queue and a "
        "/run/lock file, all holding a secret; X's workspace is removed; run Y, given the "
        "same uid, looks for each",
        "Y finds none of them; nothing of X's uid is left on the host",
    ) as row:
        planted = await _bash(
            leaver, _with_script("plant.py", PLANT, f"{_python('plant.py')} {SECRET}; id -u")
        )
        assert "key in user: True" in planted["stdout"], planted
        assert "shm: True" in planted["stdout"], planted
        _remove(Path(settings.workspace_root), leaver.run_id)
        finder = Caller(dispatcher, settings, f"finder-{secrets.token_hex(4)}")
        found = await _bash(finder, _with_script("find.py", FIND, f"{_python('find.py')}; id -u"))
        left_on_host = _segments_of(box.uid) + [
            path for path in ("/run/lock/toolq-planted",) if os.path.exists(path)
        ]
        row.observed = (
            f"X planted: {planted['stdout'].splitlines()[0]}; Y (uid "
            f"{found['stdout'].split()[-1]}) found: {found['stdout'].splitlines()[0]}; "
            f"left on the host: {left_on_host or 'none'}"
        )
        assert found["stdout"].split()[-1] == str(box.uid) == planted["stdout"].split()[-1]
        assert SECRET not in found["stdout"] + found["stderr"]
        assert found["stdout"].splitlines()[0] == "[]", found
        assert left_on_host == []
        _remove(Path(settings.workspace_root), finder.run_id)


async def test_shared_memory_a_call_leaves_goes_with_it(fleet: tuple[Fleet, Dispatcher]) -> None:
    box, dispatcher = fleet
    settings = box.stack.settings
    caller = Caller(dispatcher, settings, f"segments-{secrets.token_hex(4)}")
    with box.case(
        f"3 calls of one run each make a {SEGMENT_MB} MiB SysV shared memory segment, touch "
        f"it and leave it (calls limited to {MEMORY_MB} MiB)",
        "each call's segment is gone with the call: nothing pinned on the host after them",
    ) as row:
        made = []
        for _ in range(3):
            answer = await _bash(
                caller, _with_script("segment.py", SEGMENT, f"{_python('segment.py')} {SEGMENT_MB}")
            )
            said = answer["stdout"].strip() or answer["stderr"].strip()[-80:]
            made.append(said)
            assert said.startswith("left"), answer
            wait_for(lambda: not _segments_of(box.uid), what="the call's segment to go")
        row.observed = f"calls: {made}; left on the host: {_segments_of(box.uid) or 'none'}"
        # Each call's own namespace, not the host's, gone with the call's last process (its
        # number is soon another's: the kernel gives freed ones again).
        assert os.readlink("/proc/self/ns/ipc") not in {said.split()[-1] for said in made}
    _remove(Path(settings.workspace_root), caller.run_id)


async def test_processes_of_one_call_share_its_memory_limit(
    fleet: tuple[Fleet, Dispatcher],
) -> None:
    box, dispatcher = fleet
    settings = box.stack.settings
    caller = Caller(dispatcher, settings, f"hogs-{secrets.token_hex(4)}")
    workers = _worker_processes(box.stack)
    hogs = " ".join([f"{_python('hog.py')} {HOG_MB} {HOGS} &"] * HOGS)
    with box.case(
        f"one call starts {HOGS} processes that each hold {HOG_MB} MiB at once "
        f"(the call's limit: {MEMORY_MB} MiB); another call makes two {SEGMENT_MB} MiB "
        "SysV segments",
        "stopped by the call's control group, the worker untouched (the OOM killer's first "
        "choice is the call); where no control group can be had, every answer says memory is "
        "bounded per process only",
    ) as row:
        held = await _bash(caller, _with_script("hog.py", HOG, f"{hogs} wait"))
        shm = await _bash(
            caller,
            _with_script(
                "segment.py",
                SEGMENT,
                f"{_python('segment.py')} {SEGMENT_MB} && {_python('segment.py')} {SEGMENT_MB}",
            ),
        )
        # Where memory runs short for the worker and its calls together, the call goes first.
        score = (await _bash(caller, "cat /proc/self/oom_score_adj"))["stdout"].strip()
        per_process = "memory-per-process-only" in held["isolation"]
        alive = [pid for pid in workers if os.path.exists(f"/proc/{pid}")]
        _observe(row, held, shm, per_process, len(alive), len(workers))
        row.observed += f"; the command's oom_score_adj {score}"
        assert alive == workers
        assert score == "1000"
        # Shared memory is the call's in every mode: charged to its group, or, without one,
        # bounded by its IPC namespace's limit.
        assert shm["stdout"].count("left") < 2, shm  # the second segment was never held
        assert shm["exit_code"] != 0, shm  # and the answer says the command did not succeed
        if per_process:
            # No control group here: the rlimit holds each process alone, and the answer says so.
            assert not any("memory" in layer for layer in held["isolation"] if "cgroup" in layer)
        else:
            assert held["stdout"].splitlines().count("all held") == 0, held
            assert held["usage"]["oom_killed"], held
    _remove(Path(settings.workspace_root), caller.run_id)


def _worker_processes(stack: Stack) -> list[int]:
    """The sandbox worker's own processes: not its spawners, nor the launches they keep ready
    (which come and go), which the fleet lists as its descendants too."""
    found = []
    for pid in stack.fleet.worker_pids("sandbox"):
        try:
            name = Path(f"/proc/{pid}/comm").read_text().strip()
            argv = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if not name.startswith("toolq-") and b"spawner" not in argv:
            found.append(pid)
    return found


def _observe(
    row: Row, held: dict[str, Any], shm: dict[str, Any], per_process: bool, alive: int, of: int
) -> None:
    usage = held.get("usage") or {}
    row.observed = (
        f"{HOGS} holders: {held['stdout'].splitlines().count('all held')} saw all held, exit "
        f"{held['exit_code']}, oom_killed {usage.get('oom_killed')}; two segments: exit "
        f"{shm['exit_code']}, {shm['stdout'].count('left')} made; isolation says memory per "
        f"process only: {per_process}; "
        f"workers alive {alive}/{of}"
    )
