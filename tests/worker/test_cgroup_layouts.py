"""Which control-group hierarchy does which job for run_bash, on trees of the tests' own that
stand for /sys/fs/cgroup: a hybrid host, pure v2, v1 alone, nothing, and the v2 rule that a
group with processes shares no controllers with its children."""

from __future__ import annotations

from pathlib import Path

import pytest

from worker.sandbox import cgroup_layout as cgroup_detection
from worker.sandbox.call_cgroup import CallGroup
from worker.sandbox.cgroup_layout import CPU_LIMIT, CgroupLayout, detect_layout

V1_CONTROLLERS = ("pids", "memory", "cpuacct", "freezer", "cpu")


class FakeMachine:
    """A tree standing for /sys/fs/cgroup, with the mountinfo and /proc/self/cgroup that go
    with it: the kernel's own files are plain files the test writes."""

    def __init__(
        self,
        base: Path,
        *,
        v2_controllers: str | None = "",
        v1: tuple[str, ...] = V1_CONTROLLERS,
        own: str = "/",
    ) -> None:
        self.root = base / "cgroup"
        self.root.mkdir(parents=True)
        mounts = []
        if v2_controllers is not None:
            self.v2 = self.root / "unified"
            for directory in (self.v2 / own.strip("/"), self.v2 / own.strip("/") / "toolq-sandbox"):
                directory.mkdir(parents=True, exist_ok=True)
            own_v2 = self.v2 / own.strip("/")
            (own_v2 / "cgroup.controllers").write_text(v2_controllers)
            (own_v2 / "cgroup.subtree_control").write_text("")
            (own_v2 / "cgroup.procs").write_text("")
            # The kernel gives every new v2 group these.
            (own_v2 / "toolq-sandbox" / "cpu.stat").write_text("usage_usec 0\n")
            mounts.append(f"41 31 0:38 / {self.v2} rw,relatime - cgroup2 cgroup2 rw")
        for number, controller in enumerate(v1):
            (self.root / controller).mkdir()
            mounts.append(
                f"{32 + number} 31 0:{29 + number} / {self.root / controller} rw,relatime - "
                f"cgroup cgroup rw,{controller}"
            )
        self.mountinfo = "\n".join(mounts) + "\n"
        self.proc_cgroup = f"0::{own}\n" + "".join(
            f"{n + 1}:{controller}:{own}\n" for n, controller in enumerate(v1)
        )

    def layout(self, mode: str = "auto") -> CgroupLayout:
        return detect_layout(
            mode,  # type: ignore[arg-type]
            str(self.root),
            mountinfo=self.mountinfo,
            proc_cgroup=self.proc_cgroup,
        )


def test_on_a_hybrid_machine_v2_kills_and_counts_cpu_and_v1_limits(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path)  # like this one: v2 without controllers, v1 holding them

    layout = machine.layout()

    assert layout.layers == (
        "cgroup-v2(kill,cpu)",
        "cgroup-v1(pids)",
        "cgroup-v1(memory)",
        "cgroup-v1(cpu-limit)",
    )
    assert layout.missing == ()
    assert layout.by("memory") == "cgroup v1"
    assert layout.by(CPU_LIMIT) == "cgroup v1"
    assert (machine.root / "pids" / "toolq-sandbox").is_dir()


def test_where_v2_has_the_controllers_it_does_every_job(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, v2_controllers="cpu memory pids", v1=())

    layout = machine.layout()

    assert layout.layers == ("cgroup-v2(kill,cpu,pids,memory,cpu-limit)",)
    # Enabled for the worker's group's children, then for the call groups below.
    assert "+" in (machine.v2 / "cgroup.subtree_control").read_text()
    assert "+" in (machine.v2 / "toolq-sandbox" / "cgroup.subtree_control").read_text()


def test_v1_mode_uses_every_v1_controller(tmp_path: Path) -> None:
    layout = FakeMachine(tmp_path).layout("v1")

    assert layout.layers == (
        "cgroup-v1(kill)",
        "cgroup-v1(cpu)",
        "cgroup-v1(pids)",
        "cgroup-v1(memory)",
        "cgroup-v1(cpu-limit)",
    )


def test_v2_mode_leaves_what_v2_lacks_to_the_rlimits_and_says_why(tmp_path: Path) -> None:
    layout = FakeMachine(tmp_path).layout("v2")

    assert layout.layers == ("cgroup-v2(kill,cpu)",)
    reasons = dict(layout.missing)
    assert (
        reasons["pids"]
        == "the v2 hierarchy offers no pids controller here (a v1 hierarchy holds it)"
    )
    assert set(reasons) == {"pids", "memory", CPU_LIMIT}
    assert layout.why_not(CPU_LIMIT) == (
        "the v2 hierarchy offers no cpu controller here (a v1 hierarchy holds it)"
    )


def test_without_a_freezer_v1_kills_the_members_one_by_one(tmp_path: Path) -> None:
    layout = FakeMachine(tmp_path, v2_controllers=None, v1=("pids", "memory")).layout()

    assert layout.layers == ("cgroup-v1(kill,pids)", "cgroup-v1(memory)")
    assert [job for job, _ in layout.missing] == ["cpu", CPU_LIMIT]
    assert dict(layout.missing)["cpu"].endswith("; no cgroup v1 cpuacct hierarchy is mounted")


def test_nothing_mounted_means_no_groups_and_every_reason(tmp_path: Path) -> None:
    layout = FakeMachine(tmp_path, v2_controllers=None, v1=()).layout()

    assert layout.hierarchies == ()
    assert [job for job, _ in layout.missing] == ["kill", "cpu", "pids", "memory", CPU_LIMIT]


def test_a_folder_where_no_group_can_be_made_is_a_reason(tmp_path: Path) -> None:
    machine = FakeMachine(tmp_path, v2_controllers=None, v1=("pids",))
    (machine.root / "pids" / "toolq-sandbox").write_text("a file, not a folder")

    layout = machine.layout()

    assert layout.hierarchies == ()
    assert "cannot make control groups in" in dict(layout.missing)["pids"]


def test_a_busy_v2_group_is_left_alone_unless_it_is_a_containers_root(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """v2 lets no group with processes share controllers with its children. At the root of a
    container's cgroup namespace the worker moves the processes to a leaf; a group of someone
    else's (a systemd unit) stays as it is, and v1 or the rlimits do those jobs."""
    enabled: list[str] = []

    def busy_until_moved(group: Path, controller: str) -> str | None:
        if group.name != "toolq-sandbox" and not (group / "toolq-worker").exists():
            return f"cannot enable {controller} in {group}: busy"
        enabled.append(controller)
        return None

    monkeypatch.setattr(cgroup_detection, "_enable", busy_until_moved)
    unit = FakeMachine(tmp_path / "unit", v2_controllers="memory pids", v1=(), own="/svc")
    container = FakeMachine(tmp_path / "container", v2_controllers="memory pids", v1=())
    (container.v2 / "cgroup.procs").write_text("4242\n")

    in_a_unit = unit.layout()
    in_a_container = container.layout()

    assert in_a_unit.layers == ("cgroup-v2(kill,cpu)",)
    assert "delegated group of its own" in dict(in_a_unit.missing)["pids"]
    assert in_a_container.layers == ("cgroup-v2(kill,cpu,pids,memory)",)
    assert (container.v2 / "toolq-worker" / "cgroup.procs").read_text() == "4242"


def test_a_calls_cpu_limit_is_written_as_the_kernel_reads_it_in_each_version(
    tmp_path: Path,
) -> None:
    v2 = FakeMachine(tmp_path / "v2", v2_controllers="cpu memory pids", v1=()).layout()
    v1 = FakeMachine(tmp_path / "v1", v2_controllers=None).layout()

    on_v2 = CallGroup.create(v2, worker="w", max_processes=8, memory_bytes=1 << 26, cpu=0.5)
    on_v1 = CallGroup.create(v1, worker="w", max_processes=8, memory_bytes=1 << 26, cpu=0.5)
    unlimited = CallGroup.create(v1, worker="w", max_processes=8, memory_bytes=1 << 26)

    (v2_dir,) = on_v2.dirs.values()
    assert (v2_dir / "cpu.max").read_text() == "50000 100000"
    cpu_v1 = on_v1.dirs[next(h for h in v1.hierarchies if CPU_LIMIT in h.jobs)]
    assert (cpu_v1 / "cpu.cfs_quota_us").read_text() == "50000"
    assert (cpu_v1 / "cpu.cfs_period_us").read_text() == "100000"
    assert on_v1.usage().cpu_limit == 0.5
    # No limit asked: no group in the hierarchy that would only hold one.
    assert not any(CPU_LIMIT in h.jobs for h in unlimited.dirs)
    assert unlimited.usage().cpu_limit is None
