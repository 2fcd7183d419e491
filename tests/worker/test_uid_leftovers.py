"""The sweep of a uid's leftovers without namespaces (``TOOLQ_SANDBOX_ISOLATION=process``), as
several fleets and image containers on one host meet it: it ends only what this fleet's idle uids
left, never another fleet's commands, a uid nobody claims, or a run's image container. Real
processes of real uids and a real control group."""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.reliability.conftest import alive
from tests.worker.conftest import sleeps
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import UidRange
from worker.sandbox import SandboxConfig
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.uid_leftovers import BOX_GROUPS, sweep_idle_uids

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or shutil.which("setpriv") is None,
    reason="processes of other uids need root and setpriv",
)

_HIERARCHIES = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup", "/sys/fs/cgroup/pids")


@pytest.fixture
def box_group() -> Iterator[Path]:
    """A control group where the runtime puts an image container's processes."""
    for hierarchy in map(Path, _HIERARCHIES):
        if not (hierarchy / "cgroup.procs").exists():
            continue
        group = hierarchy / BOX_GROUPS.strip("/") / f"test-{secrets.token_hex(4)}"
        try:
            group.mkdir(parents=True)
        except OSError:
            continue
        yield group
        with contextlib.suppress(OSError):
            group.rmdir()
        return
    pytest.skip("no control group can be made here")


def _as(uid: int, tag: str, procs: Path | None = None) -> subprocess.Popen[bytes]:
    join = f"echo $$ > {procs} && " if procs else ""
    return subprocess.Popen(
        ["sh", "-c", f"{join}exec setpriv --reuid={uid} --regid={uid} --clear-groups sleep {tag}"]
    )


def test_the_sweep_ends_only_this_fleets_idle_uids_and_never_a_box(
    tmp_path: Path, box_group: Path
) -> None:
    first = 74_000 + 10 * secrets.randbelow(1000)
    root = tmp_path / "workspaces"
    root.mkdir()
    config = SandboxConfig(
        SandboxSettings(
            isolation="process",
            uid_range=str(UidRange(first=first, last=first + 9)),
            host_state=str(tmp_path / "host"),
        ),
        workspace_root=str(root),
    )
    host = HostRegistry(config.host_state)
    assert host.claim_uid(first, config.fleet(), "run-left-behind")
    assert host.claim_uid(first + 1, "another-fleet", "its-run")
    tags = {name: f"{secrets.randbelow(10**6)}.{i}" for i, name in enumerate("abcd")}
    started = {
        "left behind": _as(first, tags["a"]),
        "another fleet's": _as(first + 1, tags["b"]),
        "nobody's uid": _as(first + 2, tags["c"]),
        "this fleet's box": _as(first, tags["d"], box_group / "cgroup.procs"),
    }
    try:
        wait_for(lambda: all(sleeps(t) for t in tags.values()), 10, "the commands to start")

        killed = sweep_idle_uids(config)

        assert killed == 1
        assert not alive(started["left behind"].pid)
        assert [name for name, proc in started.items() if alive(proc.pid)] == [
            "another fleet's",
            "nobody's uid",
            "this fleet's box",
        ]
    finally:
        for proc in started.values():
            proc.kill()
            proc.wait(10)
