"""The host's registry, as two fleets on one host meet it: a uid one holds is never the other's,
a worker's liveness is its lock (seen from any PID namespace), and a sweep ends only its own
fleet's dead workers' commands. Real files, real locks, real processes and control groups."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import secrets
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.bounded import read_line
from tests.conftest import REPO, RedisServer, fleet_settings, wait_for
from tests.worker.conftest import orphaned_sleep, sandbox_worker_start, sleeps
from worker.contract.uid_range import UidRange
from worker.exceptions import IdentityError
from worker.sandbox import SandboxConfig, SandboxSettings, sweep_orphans
from worker.sandbox.call_cgroup import CallGroup, sweep_groups
from worker.sandbox.cgroup_layout import CgroupLayout, detect_layout
from worker.sandbox.fleet_key import KEY_FILE, fleet_id
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.identity import claims_dir, identity_of, release
from worker.state_folder import STATE_DIR
from worker.tasks import EXIT_CANNOT_ISOLATE

#: A worker process of a fleet: takes its id, says it, and lives until its input closes.
_WORKER = r"""
import sys
from worker.sandbox.host_registry import HostRegistry
print(HostRegistry(sys.argv[1]).worker_id(sys.argv[2]), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def host(tmp_path: Path) -> HostRegistry:
    return HostRegistry(tmp_path / "host")


@pytest.fixture
def roots(tmp_path: Path) -> tuple[Path, Path]:
    """The workspace roots of two fleets."""
    first, second = tmp_path / "fleet-a", tmp_path / "fleet-b"
    first.mkdir()
    second.mkdir()
    return first, second


def _worker(host: HostRegistry, fleet: str, *unshare: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [*unshare, sys.executable, "-c", _WORKER, str(host.folder), fleet],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    return proc, read_line(proc, "the worker to register on the host").strip()


def _end(proc: subprocess.Popen[str]) -> None:
    """The worker process ends (its input closes), in whatever PID namespace it is."""
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.close()
    proc.wait(10)
    proc.stdout.close()


def test_a_uid_held_by_one_fleet_is_skipped_by_the_other(host: HostRegistry) -> None:
    assert host.claim_uid(70_001, "fleet-a", "run-1")

    assert not host.claim_uid(70_001, "fleet-b", "run-9")
    assert host.claim_uid(70_001, "fleet-a", "run-1")  # its holder finds it again
    host.release_uid(70_001, "fleet-b", "run-9")  # another's release lets nothing go
    assert host.uid_holder(70_001) is not None
    assert host.uid_holder(70_001).fleet == "fleet-a"  # type: ignore[union-attr]

    host.release_uid(70_001, "fleet-a", "run-1")
    assert host.uid_holder(70_001) is None
    assert host.claim_uid(70_001, "fleet-b", "run-9")


def test_a_fleets_claim_its_release_did_not_reach_is_taken_over_by_its_next_run(
    host: HostRegistry,
) -> None:
    assert host.claim_uid(70_002, "fleet-a", "run-old")

    assert host.claim_uid(70_002, "fleet-a", "run-new")
    assert not host.claim_uid(70_002, "fleet-b", "run-x")


def test_two_fleets_on_one_host_never_hand_one_uid_to_two_runs(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    uids = UidRange(first=71_000, last=71_007)
    taken_a = {identity_of(roots[0], f"run-a{i}", uids, host.folder)[0] for i in range(4)}
    # Fleet B's runs try ids of every kind, fleet A's included: none gets a uid A holds.
    taken_b = {identity_of(roots[1], f"run-a{i}", uids, host.folder)[0] for i in range(4)}

    assert len(taken_a) == len(taken_b) == 4
    assert not taken_a & taken_b
    with pytest.raises(IdentityError, match="no free uid"):
        identity_of(roots[1], "run-b-one-too-many", uids, host.folder)


def test_release_frees_the_uid_for_the_other_fleet(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    uids = UidRange(first=71_100, last=71_100)
    uid, _ = identity_of(roots[0], "run-a", uids, host.folder)
    # The operator can tell whose a claim is.
    assert str(roots[0]) in (host.folder / "uids" / str(uid)).read_text()
    with pytest.raises(IdentityError):
        identity_of(roots[1], "run-b", uids, host.folder)

    release(roots[0], "run-a", uid, host.folder)

    assert identity_of(roots[1], "run-b", uids, host.folder) == (uid, uid)
    assert not (claims_dir(roots[0]) / str(uid)).exists()


def test_a_uid_is_not_the_public_hash_of_the_run_id(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    uids = UidRange(first=72_000, last=72_000 + 65_535)
    runs = [f"chosen-{i}" for i in range(16)]
    public = [
        uids.first + int.from_bytes(hashlib.sha256(r.encode()).digest()[:8], "big") % uids.size
        for r in runs
    ]

    given = [identity_of(roots[0], r, uids, host.folder)[0] for r in runs]

    assert sum(g == p for g, p in zip(given, public, strict=True)) <= 1
    key = roots[0] / STATE_DIR / KEY_FILE
    assert key.stat().st_mode & 0o777 == 0o600
    assert fleet_id(roots[0]) != fleet_id(roots[1])


def test_a_registry_others_can_reach_is_refused_in_one_line(tmp_path: Path) -> None:
    opened = tmp_path / "opened"
    opened.mkdir(mode=0o755)
    os.chmod(opened, 0o755)
    linked = tmp_path / "linked"
    linked.symlink_to(opened)

    for folder in (opened, linked):
        refusal = HostRegistry(folder).refusal()
        assert refusal is not None
        assert "TOOLQ_SANDBOX_HOST_STATE" in refusal
        assert "\n" not in refusal
    assert HostRegistry(tmp_path / "fresh").refusal() is None
    assert (tmp_path / "fresh").stat().st_mode & 0o777 == 0o700


@pytest.mark.parametrize("namespace", ["same", "own-pid-namespace"])
def test_a_worker_is_alive_while_it_lives_whatever_its_pid_namespace(
    host: HostRegistry, namespace: str
) -> None:
    unshare = ("unshare", "--pid", "--fork", "--mount-proc") if namespace != "same" else ()
    if unshare and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("a PID namespace of its own needs root and unshare")
    proc, worker = _worker(host, "fleet-a", *unshare)
    try:
        assert host.worker_alive(worker) is True
        with host.dead_workers("fleet-a") as dead:
            assert worker not in dead
    finally:
        _end(proc)

    assert host.worker_alive(worker) is False
    with host.dead_workers("fleet-b") as dead:
        assert worker not in dead  # another fleet's: not B's to end
    with host.dead_workers("fleet-a") as dead:
        assert worker in dead
    assert host.worker_alive(worker) is None  # its lock file went with it


@pytest.fixture
def layout() -> CgroupLayout:
    if os.geteuid() != 0:
        pytest.skip("control groups are made by a root worker here")
    found = detect_layout("auto", "/sys/fs/cgroup")
    if found.doing("kill") is None:
        pytest.skip("this machine gives no control group that kills")
    return found


@pytest.fixture
def orphan(layout: CgroupLayout, host: HostRegistry) -> Iterator[tuple[CallGroup, int]]:
    """A command in the call group of fleet B's worker process, which died."""
    proc, worker = _worker(host, "fleet-b")
    _end(proc)
    group = CallGroup.create(layout, worker=worker, max_processes=16, memory_bytes=64 << 20)
    command = subprocess.Popen(
        ["sh", "-c", 'echo 0 > "$1" && exec sleep 300', "sh", group.join_files[0]],
        start_new_session=True,
    )
    wait_for(lambda: command.pid in group.members(), 10, "the command in its group")
    yield group, command.pid
    group.remove()
    command.wait(10)


def test_a_sweep_leaves_another_fleets_dead_workers_commands_alone(
    layout: CgroupLayout, host: HostRegistry, orphan: tuple[CallGroup, int]
) -> None:
    group, pid = orphan

    found = sweep_groups(layout, host, "fleet-a")

    assert found == 0
    assert pid in group.members()
    os.kill(pid, 0)


def test_a_sweep_ends_its_own_fleets_dead_workers_commands(
    layout: CgroupLayout, host: HostRegistry, orphan: tuple[CallGroup, int]
) -> None:
    group, pid = orphan

    found = sweep_groups(layout, host, "fleet-b")

    assert found == 1
    assert not any(d.exists() for d in group.dirs.values())
    wait_for(lambda: _gone(pid), 10, "the orphaned command to end")


def test_a_sweep_leaves_a_live_workers_commands_alone(
    layout: CgroupLayout, host: HostRegistry
) -> None:
    proc, worker = _worker(host, "fleet-a")
    group = CallGroup.create(layout, worker=worker, max_processes=16, memory_bytes=64 << 20)
    try:
        command = subprocess.Popen(
            ["sh", "-c", 'echo 0 > "$1" && exec sleep 300', "sh", group.join_files[0]]
        )
        wait_for(lambda: command.pid in group.members(), 10, "the command in its group")

        assert sweep_groups(layout, host, "fleet-a") == 0
        assert command.pid in group.members()
    finally:
        group.remove()
        _end(proc)
    command.wait(10)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


@pytest.mark.integration
def test_a_sandbox_worker_that_cannot_use_the_hosts_registry_refuses_to_start(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    # A registry any user could reach: another fleet's runs could plant claims in it.
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o755)
    settings = fleet_settings(own_redis.url, tmp_path / "workspaces", sandbox_host_state=opened)

    status, lines = sandbox_worker_start(settings)

    assert status == EXIT_CANNOT_ISOLATE
    assert lines == [f"error: {HostRegistry(opened).refusal()}"]
    assert "TOOLQ_SANDBOX_HOST_STATE" in lines[0]


def test_runs_sharing_one_uid_are_swept_only_by_their_own_fleet(
    roots: tuple[Path, Path], sandbox_dir: Path
) -> None:
    """Without control groups or per-run uids, a command is found by the mark in its
    environment: its worker's id, which another fleet's sweep never takes for one of its own."""
    if os.geteuid() != 0:
        pytest.skip("runs as the sandbox user need a root worker")
    options = SandboxSettings(isolation="process", cgroup="off", uid_range="", shared="allow")
    tag = orphaned_sleep(
        sandbox_dir,
        f"SandboxConfig(SandboxSettings(**{options.model_dump(mode='json')!r}), "
        f"workspace_root={str(roots[0])!r})",
    )
    other_fleet = SandboxConfig(options, workspace_root=str(roots[1]))
    own_fleet = SandboxConfig(options, workspace_root=str(roots[0]))

    assert sweep_orphans(other_fleet) == 0
    assert sleeps(tag)
    wait_for(
        lambda: sweep_orphans(own_fleet) == 0 and not sleeps(tag),
        10,
        "its own fleet's sweep to end the orphaned command",
    )


def test_a_release_leaves_alone_a_uid_another_fleet_holds_on_this_host(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    """Fleet A's run held uid N on another host; here fleet B's run holds N and runs as it.
    Removing A's workspace here ends nothing of B's run."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a process of another uid needs root and setpriv")
    uid = 73_000 + secrets.randbelow(1000)
    assert host.claim_uid(uid, fleet_id(roots[1]), "run-b")
    claims = claims_dir(roots[0])
    claims.mkdir(parents=True)
    (claims / str(uid)).write_text("run-a")
    tag = f"{secrets.randbelow(10**6)}.31"
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", tag]
    b_process = subprocess.Popen(command)
    try:
        wait_for(lambda: bool(sleeps(tag)), 10, "fleet B's command to start")

        release(roots[0], "run-a", uid, host.folder)

        assert b_process.poll() is None
        assert host.uid_holder(uid) is not None
        assert not (claims / str(uid)).exists()
    finally:
        b_process.kill()
        b_process.wait(10)


def test_a_uid_another_fleet_provably_let_go_is_taken(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    """A fleet taken off the host (its workspace root gone), or whose release did not reach
    this host (its own claim gone), holds nothing here any more; a claim made from another
    mount namespace, whose paths mean other folders, cannot be proved stale and stands."""
    uids = UidRange(first=75_000, last=75_000)
    uid, _ = identity_of(roots[1], "run-b", uids, host.folder)
    (claims_dir(roots[1]) / str(uid)).unlink()  # released on another host
    assert identity_of(roots[0], "run-a", uids, host.folder) == (uid, uid)

    shutil.rmtree(roots[0])  # fleet A is gone from the host, its claim left here
    roots[0].mkdir()
    assert identity_of(roots[1], "run-b2", uids, host.folder) == (uid, uid)

    claim = host.folder / "uids" / str(uid)
    fleet, run, where, _, *_ = claim.read_text().split("\n")
    claim.write_text(f"{fleet}\n{run}\n{where}\nmnt:[1]\n")  # made in another mount namespace
    shutil.rmtree(roots[1])
    with pytest.raises(IdentityError, match="no free uid"):
        identity_of(roots[0], "run-a2", uids, host.folder)


def test_a_uid_whose_process_runs_here_is_never_taken_whatever_the_files_say(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    """Fleet A's volume is not mounted for a moment (its workspace root looks empty), while a
    command of A's run still runs as the uid: fleet B does not get it."""
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("a process of another uid needs root and setpriv")
    uid = 76_000 + secrets.randbelow(1000)
    uids = UidRange(first=uid, last=uid)
    identity_of(roots[0], "run-a", uids, host.folder)
    tag = f"{secrets.randbelow(10**6)}.33"
    command = ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", "sleep", tag]
    a_process = subprocess.Popen(command)
    try:
        wait_for(lambda: bool(sleeps(tag)), 10, "fleet A's command to start")
        shutil.rmtree(roots[0] / STATE_DIR)

        with pytest.raises(IdentityError, match="no free uid"):
            identity_of(roots[1], "run-b", uids, host.folder)
    finally:
        a_process.kill()
        a_process.wait(10)
    assert identity_of(roots[1], "run-b", uids, host.folder) == (uid, uid)


def _identities(
    root: str, host: str, runs: list[str], uids: UidRange, start: Any, told: Any
) -> None:
    """One worker process of fleet A: the uid of each run, asked as soon as all are ready."""
    try:
        start.wait(90)
        told.put([identity_of(Path(root), run, uids, host)[0] for run in runs])
    except (IdentityError, threading.BrokenBarrierError) as exc:
        told.put(repr(exc))


def test_a_fleets_processes_claiming_at_once_beside_another_fleet_agree_and_never_refuse(
    host: HostRegistry, roots: tuple[Path, Path]
) -> None:
    # Fleet B holds three uids of every four: most of A's runs first try one of B's, claim it
    # for the fleet, find it B's here and let it go, while A's other processes ask for the
    # same runs. None of them may take that passing claim for the run's, nor miss it.
    uids = UidRange(first=72_000, last=72_063)
    for uid in range(uids.first, uids.last + 1):
        if uid % 4:
            assert host.claim_uid(uid, "fleet-b", f"run-b-{uid}")
    runs = [f"run-a{i}" for i in range(16)]
    # Spawned, not forked: a fork of this many-threaded process can inherit a lock held.
    context = multiprocessing.get_context("spawn")
    start, told = context.Barrier(4), context.Queue()
    workers = [
        context.Process(
            target=_identities, args=(str(roots[0]), str(host.folder), runs, uids, start, told)
        )
        for _ in range(4)
    ]
    for worker in workers:
        worker.start()
    try:
        answers = [told.get(timeout=100) for _ in workers]
    finally:
        # One that hangs must not hold pytest's exit, which joins every child it has.
        for worker in workers:
            worker.join(30)
            if worker.is_alive():
                worker.kill()
                worker.join(10)

    # Every process found each run's one uid, none of B's; nothing else is claimed.
    assert answers[0] == answers[1] == answers[2] == answers[3], answers
    held = answers[0]
    assert len(set(held)) == len(runs) and all(uid % 4 == 0 for uid in held)
    claims = sorted(path.name for path in claims_dir(roots[0]).iterdir())
    assert claims == sorted(str(uid) for uid in held)
