"""Two fleets on one host at once, as an operator runs staging beside production: their own
brokers and workspace roots, one sandbox worker in a PID namespace of its own (namespaces), the
other in process mode. While one fleet's commands run, the other's worker is killed mid-call and
started again (its sweeps run), its runs take the very run ids of the first's, and both fleets'
sweeps are called: no command of the first is killed, and no uid is given to both.
"""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import uuid
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.local.stack import worker_argv, worker_environment
from tests.conftest import Caller, RedisServer, fleet_settings, start_logged, wait_for
from tests.reliability.conftest import find_process
from tests.reliability.report import Report
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.sandbox import SandboxConfig, sweep_orphans

pytestmark = pytest.mark.integration

#: How long a sandbox worker may take to announce itself on a busy machine.
START_BOUND_S = 120.0
#: Each fleet's runs at once.
RUNS = 3
#: A command that says it started, then runs until the test lets it end, then names its uid.
WAIT_FOR_GO = "touch started; while [ ! -e go ]; do sleep 0.1; done; id -u; echo survived"


class SandboxWorker:
    """A fleet's sandbox worker, started again with a new name after each kill; with
    ``own_pid_namespace``, inside ``unshare --pid --fork --mount-proc``."""

    def __init__(self, settings: WorkerSettings, log_dir: Path, *, own_pid_namespace: bool):
        self.settings = settings
        self._log_dir = log_dir
        self._unshare = (
            ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]
            if own_pid_namespace
            else []
        )
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SandboxWorker:
        node = f"sandbox-{uuid.uuid4().hex[:6]}"
        argv = worker_argv(
            "sandbox",
            node=f"{node}@%h",
            concurrency=RUNS + 1,
            loglevel="WARNING",
            extra=("--without-gossip", "--without-mingle"),
        )
        env = {**os.environ, **worker_environment(self.settings)}
        self.log = self._log_dir / f"{node}.log"
        self.proc = start_logged([*self._unshare, *argv], env, self.log)
        key = keys.worker_heartbeat("sandbox", f"{node}@{socket.gethostname()}")
        client = redis.Redis.from_url(self.settings.redis_url)

        def announced() -> bool:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"{node} exited:\n{self.log.read_text(errors='replace')}")
            return bool(client.exists(key))

        try:
            wait_for(announced, START_BOUND_S, f"{node} to announce itself")
        finally:
            client.close()
        return self

    def kill(self) -> None:
        """SIGKILL to the worker and its pool processes, mid-call: their commands are orphans."""
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(30)


@dataclass
class Fleet:
    name: str
    server: RedisServer
    settings: WorkerSettings
    worker: SandboxWorker
    dispatcher: Dispatcher | None = None
    uids: dict[str, int] = field(default_factory=dict)

    def workspace(self, run_id: str) -> Path:
        return Path(self.settings.workspace_root) / run_id

    async def bash(self, run_id: str, command: str, timeout_ms: int = 90_000) -> dict[str, Any]:
        assert self.dispatcher is not None
        caller = Caller(self.dispatcher, self.settings, run_id)
        result = await caller("run_bash", {"command": command, "timeout": timeout_ms})
        assert not result.is_error, f"{self.name}: {result.output}"
        answer: dict[str, Any] = json.loads(result.output)
        return answer

    def sweep(self) -> int:
        return sweep_orphans(SandboxConfig.from_settings(self.settings))


def _fleet(workdir: Path, name: str, isolation: str) -> Fleet:
    root = workdir / name / "workspaces"
    root.mkdir(parents=True)
    root.chmod(0o755)
    server = RedisServer(workdir / name, password=secrets.token_hex(16))
    server.start()
    settings = fleet_settings(server.url, root, sandbox_isolation=isolation, max_timeout_ms=120_000)
    worker = SandboxWorker(settings, workdir / name, own_pid_namespace=isolation == "namespaces")
    return Fleet(name, server, settings, worker)


@pytest.fixture(scope="module")
def fleets(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fleet, Fleet]]:
    if os.geteuid() != 0:
        pytest.skip("per-run uids need a root worker")
    if shutil.which("unshare") is None:
        pytest.skip("a PID namespace of the worker's own needs unshare")
    workdir = tmp_path_factory.mktemp("fleets")
    made: list[Fleet] = []
    try:
        for name, isolation in (("in-pid-namespace", "namespaces"), ("process", "process")):
            fleet = _fleet(workdir, name, isolation)
            made.append(fleet)
            fleet.worker.start()
        yield made[0], made[1]
    finally:
        for fleet in made:
            fleet.worker.kill()
            fleet.server.stop()


@pytest.fixture
async def both(fleets: tuple[Fleet, Fleet]) -> AsyncIterator[tuple[Fleet, Fleet]]:
    first, second = fleets
    async with Dispatcher(first.settings) as one, Dispatcher(second.settings) as other:
        first.dispatcher, second.dispatcher = one, other
        yield first, second


@pytest.mark.parametrize("victim_is", [0, 1], ids=["pid-namespace-fleet", "process-fleet"])
async def test_another_fleet_on_the_host_kills_nothing_of_this_one_and_shares_no_uid(
    both: tuple[Fleet, Fleet], victim_is: int, report: Report
) -> None:
    victim, other = both[victim_is], both[1 - victim_is]
    tag = secrets.token_hex(4)
    run_ids = [f"chosen-{tag}-{i}" for i in range(RUNS)]
    running = [asyncio.create_task(victim.bash(run, WAIT_FOR_GO)) for run in run_ids]
    for run in run_ids:
        await asyncio.to_thread(
            wait_for, (victim.workspace(run) / "started").exists, 60, f"{run} to start"
        )

    # The other fleet: a command left running by its worker, killed mid-call; the worker
    # started again, which sweeps what its dead processes left.
    orphan_sleep = f"300.{secrets.randbelow(10**6)}"
    orphan = asyncio.create_task(
        other.bash(f"orphan-{tag}", f"sleep {orphan_sleep}", timeout_ms=10_000)
    )
    await asyncio.to_thread(
        wait_for, lambda: bool(find_process(("sleep", orphan_sleep))), 60, "the orphan to start"
    )
    other.worker.kill()
    await asyncio.to_thread(other.worker.start)
    # Its runs take the victim's run ids, and both fleets sweep, from this PID namespace too.
    taken = await asyncio.gather(*(other.bash(run, "id -u; sleep 0.5") for run in run_ids))
    await asyncio.to_thread(other.sweep)
    await asyncio.to_thread(victim.sweep)

    for run in run_ids:
        (victim.workspace(run) / "go").touch()
    answers = await asyncio.gather(*running)

    survived = [a["exit_code"] == 0 and a["stdout"].split()[-1:] == ["survived"] for a in answers]
    victims_uids = {int(a["stdout"].split()[0]) for a in answers if a["stdout"].split()}
    others_uids = {int(a["stdout"].split()[0]) for a in taken}
    with report.case(
        "Isolation",
        f"[two fleets on one host] while {RUNS} commands of the {victim.name} fleet run, the "
        f"{other.name} fleet's sandbox worker is killed mid-call and restarted, its runs take "
        "the same run ids, and both fleets sweep",
        "every command of the first fleet runs to its end; no uid is given to both fleets; "
        "the other fleet's own orphan is ended by its sweep",
    ) as row:
        row.observed = (
            f"{sum(survived)} of {RUNS} commands ran to their end; "
            f"{len(victims_uids & others_uids)} uid(s) shared"
        )
        assert all(survived), answers
        assert len(victims_uids) == len(others_uids) == RUNS
        assert not victims_uids & others_uids
        # The other fleet ended its own orphan: its sweep still does its job.
        await asyncio.to_thread(
            wait_for, lambda: not find_process(("sleep", orphan_sleep)), 60, "the orphan to end"
        )
    await asyncio.gather(orphan, return_exceptions=True)  # its worker died: no answer
