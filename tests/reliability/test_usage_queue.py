"""What commands used, as every run_bash answer reports it, against what the host measured.

The sandbox worker's processes are put in a cpuacct group of the test's own: the commands they
start stay in it (their own groups are in other hierarchies), so the group's CPU time, less the
worker processes' own, is what the host spent on the commands. The answers' ``cpu_ms`` must add
up to it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, wait_for
from tests.reliability.conftest import Stack, start_stack
from tests.reliability.report import Counts, Report
from worker.sandbox import SandboxConfig
from worker.sandbox.layers import plan_for

pytestmark = pytest.mark.integration

CALLS = 200
#: About 40 ms of CPU in the shell: enough that the wrappers around it (tens of microseconds
#: to a millisecond, outside the command's group) stay well inside the tolerance.
SPIN = "i=0; while [ $i -lt 40000 ]; do i=$((i+1)); done; echo done"
TOLERANCE = 0.10
CPUACCT = Path("/sys/fs/cgroup/cpuacct")
_TICK_NS = 1_000_000_000 // os.sysconf("SC_CLK_TCK")


@pytest.fixture(scope="module")
def usage_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    # Two hundred calls queue behind two worker processes: their deadlines must allow for it.
    stack = start_stack(tmp_path_factory.mktemp("usage"), max_timeout_ms=120_000)
    yield stack
    stack.stop()


@dataclass
class HostAccount:
    """A cpuacct group holding the sandbox worker's processes, and their own CPU time."""

    group: Path
    pids: list[int]
    origins: dict[int, str]

    def total_ns(self) -> int:
        return int((self.group / "cpuacct.usage").read_text())

    def workers_ns(self) -> int:
        """CPU time of the worker processes themselves (every thread), not their children's."""
        total = 0
        for pid in self.pids:
            fields = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) * _TICK_NS
        return total


def _why_no_host_account(stack: Stack) -> str | None:
    if os.geteuid() != 0:
        return "moving the worker into a cpuacct group needs root"
    if not (CPUACCT / "cpuacct.usage").exists():
        return "no cgroup v1 cpuacct hierarchy to measure the host's side with"
    layout = plan_for(SandboxConfig.from_settings(stack.settings), os.geteuid()).cgroups
    counted_by = layout.doing("cpu")
    if counted_by is None:
        return "the sandbox counts no command's CPU time in a control group here"
    if counted_by.version == 1:
        return "the commands' own CPU accounting is the cpuacct hierarchy the host measure needs"
    return None


@pytest.fixture
def host_account(usage_stack: Stack) -> Iterator[HostAccount]:
    why = _why_no_host_account(usage_stack)
    if why is not None:
        pytest.skip(why)
    group = CPUACCT / f"toolq-test-{secrets.token_hex(4)}"
    group.mkdir()
    origins: dict[int, str] = {}
    for pid in usage_stack.fleet.worker_pids("sandbox"):
        with contextlib.suppress(OSError):  # a pool process replaced since it was listed
            origins[pid] = _cpuacct_group(pid)
    pids = list(origins)
    try:
        for pid in list(pids):
            try:
                (group / "cgroup.procs").write_text(str(pid))
            except ProcessLookupError:  # replaced meanwhile: its successor was not listed
                pids.remove(pid)
        yield HostAccount(group, pids, origins)
    finally:
        for pid, origin in origins.items():
            with contextlib.suppress(OSError):  # gone
                (CPUACCT / origin.lstrip("/") / "cgroup.procs").write_text(str(pid))
        # What the worker started meanwhile and still runs (its spawner, the launches it keeps
        # ready for its next calls) goes to the group above; a launch made while they move
        # lands in the group too, and goes on the next pass.
        wait_for(lambda: _emptied(group), 10, "the test's cpuacct group to empty")
        group.rmdir()


def _emptied(group: Path) -> bool:
    """Moves what is in ``group`` to the group above; true once there was nothing to move."""
    members = (group / "cgroup.procs").read_text().split()
    for member in members:
        with contextlib.suppress(OSError):  # gone
            (group.parent / "cgroup.procs").write_text(member)
    return not members


def _cpuacct_group(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpuacct" in controllers.split(","):
            return path
    return "/"


async def test_every_answer_reports_usage_that_adds_up_to_the_hosts_measure(
    usage_stack: Stack, host_account: HostAccount, report: Report
) -> None:
    with report.case(
        "Isolation",
        f"{CALLS} concurrent run_bash calls, each a shell loop of about 40 ms of CPU",
        "every answer reports its usage; the sum of their `cpu_ms` is within "
        f"{TOLERANCE:.0%} of the CPU time the sandbox worker's host measured for the commands",
    ) as row:
        workers_before, total_before = host_account.workers_ns(), host_account.total_ns()
        async with Dispatcher(usage_stack.settings) as dispatcher:
            caller = Caller(dispatcher, usage_stack.settings, f"run-usage-{secrets.token_hex(4)}")
            results = await asyncio.gather(
                *(caller("run_bash", {"command": SPIN, "timeout": 120_000}) for _ in range(CALLS))
            )
        host_ms = (
            host_account.total_ns() - total_before - (host_account.workers_ns() - workers_before)
        ) / 1e6
        answers = [json.loads(r.output) for r in results if not r.is_error]
        reported = [a["usage"] for a in answers if a["stdout"] == "done\n"]
        complete = [u for u in reported if None not in (u["cpu_ms"], u["pids_peak"])]
        total_ms = sum(u["cpu_ms"] or 0 for u in reported)
        row.counts = Counts(
            sent=CALLS,
            answered=sum(r.error_kind != "no_answer" for r in results),
            lost=sum(r.error_kind == "no_answer" for r in results),
        )
        row.observed = (
            f"{len(complete)}/{CALLS} answers with their usage; cpu_ms summed to "
            f"{total_ms / 1000:.2f} s, the host measured {host_ms / 1000:.2f} s "
            f"({total_ms / host_ms - 1:+.1%})"
        )
        assert len(complete) == CALLS, [r.output[:200] for r in results if r.is_error][:3]
        assert abs(total_ms - host_ms) <= TOLERANCE * host_ms
