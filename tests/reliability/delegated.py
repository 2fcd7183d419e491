"""A control group delegated to a deploy-like worker, as a runtime that delegates one to a pod
would: a group of its own in each hierarchy that does a job for calls (memory, pids, freezer,
cpuacct), owned by the namespace's root, with the worker's first process in it. The worker then
makes its call groups below it (``worker.sandbox.cgroup_layout``), as it would in such a pod.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from worker.sandbox.cgroup_layout import V1_CONTROLLERS, read_or_empty

#: Where the host mounts its control groups.
CGROUP_ROOT = Path("/sys/fs/cgroup")


def delegate(pid: int, owner: int) -> list[Path]:
    """Make a group of ``pid``'s own below its group in each v1 hierarchy of a controller calls
    use, owned by ``owner``, and move ``pid`` into it; returns the groups made."""
    made: list[Path] = []
    for line in read_or_empty(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        wanted = set(controllers.split(",")) & set(V1_CONTROLLERS.values())
        if not wanted:
            continue
        mount = CGROUP_ROOT / controllers  # the host mounts each hierarchy by its controllers
        if not mount.is_dir():
            continue
        group = mount / path.lstrip("/") / f"toolq-delegated-{pid}"
        group.mkdir()
        made.append(group)
        for entry in (group, *group.iterdir()):
            os.chown(entry, owner, owner)
        (group / "cgroup.procs").write_text(str(pid))
    return made


def remove(groups: list[Path]) -> None:
    """Remove delegated groups and what the worker made below them (their processes gone)."""
    for group in groups:
        for folder in sorted(group.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                folder.rmdir()
        with contextlib.suppress(OSError):
            group.rmdir()
