"""Process mode on a shared host, tried as an attacker would: runs share the host's /tmp and
/var/tmp and its PID namespace. One run plants files open to all and symlinks there, under names
another run writes; it lists the host's processes while another run's command runs. The worker
hardened the host as it started (``worker.sandbox.hardening``); the tests put the host's
sysctls back as they found them."""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, until
from tests.host_sysctls import host_is_hardened, host_sysctls_restored
from tests.reliability.conftest import Run, Stack, pids_with, start_stack
from tests.reliability.report import Report
from worker.sandbox import SandboxConfig
from worker.sandbox.hardening import hardening_refusal
from worker.sandbox.layers import LAYER_HIDDEN_PROCESSES

pytestmark = pytest.mark.integration

SECRET = f"toolq-victim-secret-{secrets.token_hex(8)}"
#: Where a run's commands and another's meet without a mount namespace.
SHARED = ("/tmp", "/var/tmp")


@pytest.fixture(scope="module")
def process_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    if os.geteuid() != 0:
        pytest.skip("per-run uids need a root worker")
    with host_sysctls_restored():
        stack = start_stack(
            tmp_path_factory.mktemp("process-host"),
            redis_password=secrets.token_hex(16),
            sandbox_isolation="process",
        )
        try:
            yield stack
        finally:
            stack.stop()


@pytest.fixture
async def two_runs(process_stack: Stack) -> AsyncIterator[tuple[Run, Run]]:
    async with Dispatcher(process_stack.settings) as dispatcher:
        attacker = Caller(dispatcher, process_stack.settings, f"attacker-{secrets.token_hex(4)}")
        victim = Caller(dispatcher, process_stack.settings, f"victim-{secrets.token_hex(4)}")
        yield Run(attacker, process_stack), Run(victim, process_stack)


def _waiting_for_gate(then: str) -> str:
    """A command tail that says it is ready, waits (at most 30 s) for the test's gate file in
    its workspace, then runs ``then``."""
    return (
        "touch ready; i=0; while [ ! -e gate ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); "
        f"done; {then}"
    )


async def test_a_runs_planted_files_and_links_in_tmp_do_not_take_another_runs_writes(
    two_runs: tuple[Run, Run], report: Report
) -> None:
    attacker, victim = two_runs
    tag = secrets.token_hex(4)
    plants = [f"{folder}/toolq-plant-{tag}" for folder in SHARED]
    links = [f"{folder}/toolq-link-{tag}" for folder in SHARED]
    targets = [f"{folder}/toolq-target-{tag}" for folder in SHARED]
    plant = "; ".join(
        f"echo planted > {p} && chmod 666 {p} && echo target > {t} && chmod 666 {t} && "
        f"ln -s {t} {link}"
        for p, t, link in zip(plants, targets, links, strict=True)
    )
    with report.case(
        "Isolation",
        "[process] run X plants a 0666 file and a symlink to a 0666 file of its own in /tmp "
        "and /var/tmp, under names run Y then writes (`echo secret > name`, `>>`), while X's "
        "call still runs",
        "Y's writes refused (fs.protected_regular, fs.protected_symlinks, set by the worker); "
        "nothing of Y's reaches X's files",
    ) as row:
        if not host_is_hardened():
            # Another test session on this machine put the host back as it found it: hardened
            # again as the worker hardened it when it started.
            config = SandboxConfig.from_settings(attacker.stack.settings)
            assert hardening_refusal(config) is None
        assert host_is_hardened()
        shown = " ".join(plants + targets)
        planting = asyncio.ensure_future(
            attacker.bash(f"{plant}; " + _waiting_for_gate(f"cat {shown}"))
        )
        try:
            await until(
                lambda: (attacker.workspace / "ready").exists() or planting.done(),
                "the attacker's files to be planted",
            )
            writes = "; ".join(
                f"echo {SECRET} > {name}; echo {SECRET} >> {name}" for name in plants + links
            )
            written = await victim.bash(f"{writes}; true")
            # Read as the host sees them, before the attacker's run lets them go.
            landed = [path for path in plants + targets if SECRET in _read_or_empty(path)]
        finally:
            (attacker.workspace / "gate").touch()
        read = await planting
        refused = written["stderr"].count("Permission denied")
        row.observed = (
            f"Y's writes refused: {refused} of {2 * len(plants + links)}; "
            f"Y's secret in X's files: {landed or 'none'}"
        )
        assert read["exit_code"] == 0, read
        assert read["stdout"].count("planted") == len(plants), read
        assert SECRET not in read["stdout"]
        assert not landed
        assert refused == 2 * len(plants + links), written


async def test_a_run_sees_neither_another_runs_processes_nor_the_workers(
    two_runs: tuple[Run, Run], report: Report
) -> None:
    attacker, victim = two_runs
    marker = f"toolq-victim-{secrets.token_hex(4)}"
    with report.case(
        "Isolation",
        "[process] run X lists the host's processes (`ps -e`, `ls /proc`, every "
        "`/proc/*/cmdline`) while a command of run Y runs",
        "only X's own processes: neither Y's nor the worker's",
    ) as row:
        running = asyncio.ensure_future(victim.bash(f": {marker}; " + _waiting_for_gate("true")))
        try:
            await until(
                lambda: (victim.workspace / "ready").exists() or running.done(),
                "the victim's command to run",
            )
            victim_pids = pids_with(marker)
            assert victim_pids, "the victim's command is not running"
            looked = await attacker.bash(
                "ps -eo pid,uid,args; ls /proc; cat /proc/[0-9]*/cmdline | tr '\\0' ' '"
            )
        finally:
            (victim.workspace / "gate").touch()
        await running
        listed = set(looked["stdout"].split())
        seen = sorted({str(pid) for pid in victim_pids} & listed)
        row.observed = (
            f"Y's command shown: {marker in looked['stdout']}; Y's pids listed: {seen or 'none'}; "
            f"the worker (celery) shown: {'celery' in looked['stdout']}; "
            f"layers: {', '.join(looked['isolation'])}"
        )
        assert LAYER_HIDDEN_PROCESSES in looked["isolation"]
        assert "ps -eo" in looked["stdout"]
        assert marker not in looked["stdout"]
        assert not seen
        assert "celery" not in looked["stdout"]


def _read_or_empty(path: str) -> str:
    try:
        return Path(path).read_text(errors="replace")
    except OSError:
        return ""
