"""A run's own limits (``limits`` of a call), as a user notices them: a command asking for less
memory, fewer processes or less time than the worker's defaults is held to them, one asking for
more than the fleet allows is refused before it runs, and each answer says what applied."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from tests.worker.conftest import request, worker_settings
from worker.contract.run_limits import RunLimits
from worker.contract.wire import CommandAnswer, ToolCallResult
from worker.executor import Executor
from worker.results import ResultStore
from worker.sandbox.cgroup_layout import CPU_LIMIT, detect_layout

#: A command that holds 200 MB at once, and says so when it did.
ALLOCATE_200_MB = (
    "python3 -c \"b = bytearray(200 * 1024 * 1024); b[::4096] = b'x' * len(b[::4096]); "
    "print('held')\""
)
#: A fork bomb, bounded: 40 processes at once for as long as they may live.
FORK_40 = "for i in $(seq 40); do sleep 3 & done; wait; echo done"


@pytest.fixture
def executor(tmp_path: Path) -> Executor:
    store = ResultStore(fakeredis.FakeRedis(), 60)
    # Runs share one uid here: the test may not be root; the limits hold all the same.
    settings = worker_settings(
        tmp_path, sandbox_isolation="process", sandbox_uid_range="", sandbox_shared="allow"
    )
    (tmp_path / "run-1").mkdir()
    return Executor(settings, store, "test-worker:1")


def run_bash(
    executor: Executor, command: str, **extra: Any
) -> tuple[ToolCallResult, CommandAnswer]:
    result = executor.handle(request("run_bash", {"command": command}, **extra), "sandbox")
    assert not result.is_error, result.output
    return result, CommandAnswer.model_validate_json(result.output)


def test_a_run_asking_64_mb_is_stopped_where_the_default_lets_200_mb_through(
    executor: Executor,
) -> None:
    _, default = run_bash(executor, ALLOCATE_200_MB)
    _, small = run_bash(executor, ALLOCATE_200_MB, limits={"memory_mb": 64})

    assert default.stdout == "held\n", default.stderr
    assert default.usage is not None and default.usage.limits is not None
    assert default.usage.limits.memory_mb == 1024
    assert small.exit_code != 0 and "held" not in small.stdout
    # Killed by the group's limit, or refused by the address-space rlimit where no group is.
    assert small.usage is not None
    assert small.usage.oom_killed or "MemoryError" in small.stderr, small
    if small.usage.oom_killed:  # the answer says which limit killed it
        assert "the memory limit (64 MB)" in small.stderr, small.stderr
    assert small.usage.limits == RunLimits(
        timeout_s=small.usage.limits.timeout_s if small.usage.limits else None,
        memory_mb=64,
        pids=256,
        cpu=None,
    )


def test_a_pids_limit_stops_a_fork_bomb_at_the_number_asked(executor: Executor) -> None:
    _, bounded = run_bash(executor, FORK_40, limits={"pids": 8})
    _, default = run_bash(executor, FORK_40)

    assert default.stdout == "done\n", default.stderr
    assert "fork" in bounded.stderr.lower() or "resource temporarily" in bounded.stderr.lower()
    assert bounded.usage is not None and bounded.usage.limits is not None
    assert bounded.usage.limits.pids == 8
    if bounded.usage.pids_peak is not None:  # counted where a control group counts
        assert bounded.usage.pids_peak <= 8


def test_a_timeout_shorter_than_the_default_ends_the_command(executor: Executor) -> None:
    _, answer = run_bash(executor, "sleep 20; echo woke", limits={"timeout_s": 1})

    assert answer.timed_out and "woke" not in answer.stdout
    assert answer.usage is not None and answer.usage.limits is not None
    assert answer.usage.limits.timeout_s == 1


def test_a_run_asking_more_than_the_fleet_allows_is_refused_before_it_runs(
    executor: Executor, tmp_path: Path
) -> None:
    asked = {"memory_mb": 1 << 20, "pids": 8}
    result = executor.handle(request("run_bash", {"command": "touch ran"}, limits=asked), "sandbox")

    assert result.is_error and result.error_kind == "bad_request"
    assert "memory_mb=1048576 (at most 4096)" in result.output
    assert not (tmp_path / "run-1" / "ran").exists()


def test_limits_are_written_as_a_person_writes_them() -> None:
    assert RunLimits.parse("memory_mb=64, pids=8") == RunLimits(memory_mb=64, pids=8)
    assert RunLimits.parse('{"timeout_s": 2.5}') == RunLimits(timeout_s=2.5)
    with pytest.raises(ValueError, match="limits: memory_mb: Input should be greater than 0"):
        RunLimits.parse("memory_mb=0")
    with pytest.raises(ValueError, match="name=value"):
        RunLimits.parse("64")
    with pytest.raises(ValueError, match="Extra inputs"):
        RunLimits.parse("memory=64")


def test_the_default_run_says_the_workers_limits_applied(executor: Executor) -> None:
    _, answer = run_bash(executor, "true")

    assert answer.usage is not None
    assert answer.usage.limits == RunLimits(timeout_s=30, memory_mb=1024, pids=256, cpu=None)
    assert json.loads(answer.model_dump_json())["usage"]["limits"]["pids"] == 256
    assert os.environ.get("TOOLQ_SANDBOX_ID") is None


#: Busy for a fixed amount of CPU work (0.5 CPU-second of its own), whatever the wall time.
BURN_HALF_A_CPU_SECOND = (
    "python3 -c \"import time\nwhile time.process_time() < 0.5: sum(range(1000))\nprint('done')\""
)


def test_a_run_asking_a_fifth_of_a_cpu_gets_no_more_than_that(executor: Executor) -> None:
    _, answer = run_bash(executor, BURN_HALF_A_CPU_SECOND, limits={"cpu": 0.2})

    assert answer.stdout == "done\n", answer.stderr
    assert answer.usage is not None and answer.usage.limits is not None
    layout = detect_layout("auto", "/sys/fs/cgroup")
    if layout.doing(CPU_LIMIT) is None:
        # Nothing here can hold it: the answer says none held, and the heartbeat says why.
        assert answer.usage.limits.cpu is None
        pytest.skip(f"no control group can hold a CPU limit here: {layout.why_not(CPU_LIMIT)}")
    assert answer.usage.limits.cpu == 0.2
    assert answer.usage.cpu_ms is not None and answer.usage.cpu_ms >= 500
    # CPU-seconds per wall-second, as the answer tells both: 0.2 asked, the period's rounding
    # and the command's start beside it.
    assert answer.usage.cpu_ms / answer.duration_ms <= 0.3, answer.usage


def test_a_run_without_a_cpu_limit_is_told_none_held(executor: Executor) -> None:
    _, answer = run_bash(executor, "true")

    assert answer.usage is not None and answer.usage.limits is not None
    assert answer.usage.limits.cpu is None
