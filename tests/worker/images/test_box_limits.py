"""A run's own limits in its box, as a user notices them: the container's configuration holds
the memory, process and CPU limits the run asked, a command past them is stopped, and what a
command is told names what held it."""

from __future__ import annotations

import json

import pytest

from tests.worker.images.builders import BUSY_LOOP, Images
from tests.worker.images.conftest import Host
from tests.worker.images.test_boxes import run
from worker.contract.run_limits import RunLimits
from worker.images.boxes import BoxRecord
from worker.sandbox.call_cgroup import CPU_PERIOD_US
from worker.tools.bash import with_applied_limits
from worker.tools.workspace import Workspace

#: Smaller than the hosts' defaults (64 MB, 24 processes, no CPU limit).
ASKED = RunLimits(memory_mb=16, pids=8, cpu=0.2)


def limited_box(host: Host, images: Images, run_id: str) -> tuple[Workspace, BoxRecord]:
    workspace, record = host.start(run_id, images.alpha, limits=ASKED)
    assert isinstance(record, BoxRecord)
    host.sandbox = host.sandbox.with_limits(ASKED)  # the calls of the run carry its limits
    return workspace, record


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_the_containers_configuration_holds_the_runs_limits(host: Host, images: Images) -> None:
    workspace, record = limited_box(host, images, "run-config")
    resources = json.loads((host.boxes.folder / record.name / "config.json").read_text())["linux"][
        "resources"
    ]

    assert resources["cpu"] == {"quota": CPU_PERIOD_US // 5, "period": CPU_PERIOD_US}
    answer = with_applied_limits(run(host, workspace, record, "true"), host.sandbox, 10_000)
    assert answer.usage is not None and answer.usage.limits is not None
    if host.boxes.runtime(record.image).gvisor:
        # gVisor's own threads live in the box's group: no process limit there, and the
        # answer says none held.
        assert "pids" not in resources
        assert "cgroup(memory,cpu)" in answer.isolation
        assert answer.usage.limits == RunLimits(timeout_s=10, memory_mb=16, pids=None, cpu=0.2)
    else:
        assert resources["memory"]["limit"] == 16 << 20
        assert resources["pids"] == {"limit": 8 + 1}  # its init is one of them
        assert "cgroup(memory,pids,cpu)" in answer.isolation
        assert answer.usage.limits == RunLimits(timeout_s=10, memory_mb=16, pids=8, cpu=0.2)


def test_a_busy_loop_gets_a_fifth_of_a_cpu_in_a_box_asking_that(host: Host, images: Images) -> None:
    workspace, record = limited_box(host, images, "run-cpu")

    busy = run(host, workspace, record, BUSY_LOOP, timeout_ms=60_000)

    assert busy.stdout == "counted\n", busy.stderr
    assert busy.usage.cpu_limit == 0.2
    assert "cgroup(memory,pids,cpu)" in busy.isolation
    assert busy.usage.cpu_ms is not None and busy.usage.cpu_ms >= 300, busy.usage
    # CPU-seconds per wall-second, both as the answer tells them.
    assert busy.usage.cpu_ms / busy.duration_ms <= 0.3, busy


def test_a_fork_bomb_stops_at_the_runs_process_limit(host: Host, images: Images) -> None:
    workspace, record = limited_box(host, images, "run-forks")

    bomb = run(host, workspace, record, "for i in $(seq 30); do sleep 5 & done; wait")

    assert "can't fork" in bomb.stderr or "Resource temporarily unavailable" in bomb.stderr
    # The sleeps that were started, killed at the end: the run's 8, the shell among them.
    assert bomb.usage.killed_processes is not None and bomb.usage.killed_processes < 8
    if bomb.usage.pids_peak is not None:  # where the kernel counts a group's peak
        assert bomb.usage.pids_peak <= 8 + 1
    assert run(host, workspace, record, "echo alive").stdout == "alive\n"


def test_memory_past_the_runs_limit_is_killed_and_the_answer_says_so(
    host: Host, images: Images
) -> None:
    workspace, record = limited_box(host, images, "run-memory")

    hog = run(host, workspace, record, "dd if=/dev/zero of=/dev/null bs=40M count=1")

    assert hog.exit_code != 0 and hog.usage.oom_killed
    assert "memory limit" in hog.stderr and "(16 MB)" in hog.stderr, hog.stderr
    assert run(host, workspace, record, "echo alive").stdout == "alive\n"
