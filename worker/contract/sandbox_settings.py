"""The sandbox's settings (``TOOLQ_SANDBOX_*``): one model, read by ``WorkerSettings.sandbox``
and used as it is by the sandbox (``worker.sandbox.config.SandboxConfig`` holds it) and by the
image containers (``worker.images``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from worker.contract.run_limits import RunLimits
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange

#: How commands are kept apart: ``auto`` takes namespaces where they work, else process groups.
Isolation = Literal["auto", "namespaces", "process"]
#: What a worker whose runs share /tmp does about the host's sysctls (``worker.sandbox.hardening``).
HostHardening = Literal["set", "check", "off"]
#: Which control groups run_bash may use: ``auto`` takes each job (killing, CPU accounting, the
#: process limit, the memory limit) from cgroup v2 where v2 offers it, else from v1; ``v2`` and
#: ``v1`` use only that version; ``off`` uses none (rlimits alone).
CgroupMode = Literal["auto", "v2", "v1", "off"]
#: The host's registry of uids and live worker processes, for a root worker.
HOST_STATE = Path("/run/toolq")
#: The variable run_bash puts in each command's environment to mark its processes
#: (``worker.sandbox.config.MARKER_VARIABLE``): a ``TOOLQ_SANDBOX_`` name that is no setting.
_MARKER_FIELD = "id"


class SandboxSettings(BaseModel):
    """How run_bash's commands are kept apart and limited. Each field is the variable
    ``TOOLQ_SANDBOX_<FIELD>``; the limits (memory, processes, CPU) are a command's defaults,
    which a run may change within ``TOOLQ_LIMITS_MAX_*`` (``worker.contract.run_limits``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    user: str = Field(
        "nobody",
        description="run_bash's user when the worker is root and runs share one uid "
        "(TOOLQ_SANDBOX_SHARED=allow, or an empty TOOLQ_SANDBOX_UID_RANGE).",
    )
    uid_range: str = Field(
        DEFAULT_UID_RANGE,
        description="The uids (and gids) runs take, FIRST-LAST: each run's commands run as a uid "
        "of their own and its workspace is that uid's alone. Empty: runs share TOOLQ_SANDBOX_USER.",
    )
    host_state: Path = Field(
        HOST_STATE,
        description="The host's own registry of uids and live worker processes, shared by every "
        "sandbox worker on the host whatever its fleet, so that fleets never share a uid nor end "
        "each other's commands: a folder of the worker's user's alone (mode 0700).",
    )
    shared: Literal["deny", "allow"] = Field(
        "deny",
        description="allow: a sandbox worker that cannot keep runs apart (no per-run uids, as "
        "when it is not root) starts anyway and its runs share one uid; deny: it refuses to start.",
    )
    isolation: Isolation = Field(
        "auto", description="auto: PID+network namespaces where they work, else process groups."
    )
    host_hardening: HostHardening = Field(
        "set",
        description="Without namespaces, runs share the host's /tmp and /var/tmp, kept apart by "
        "fs.protected_regular and fs.protected_symlinks: set turns them on where they are off "
        "(a root worker on the host), check refuses to start where they are off, off starts "
        "anyway.",
    )
    memory_mb: int = Field(
        1024,
        gt=0,
        description="run_bash memory limit: resident memory and swap of the whole command "
        "(control group), or the address space of each process where no group can be made. "
        "A run may ask for its own (`limits.memory_mb`), up to TOOLQ_LIMITS_MAX_MEMORY_MB.",
    )
    max_processes: int = Field(
        256,
        gt=0,
        description="run_bash process limit: per call (control group), else per user. A run "
        "may ask for its own (`limits.pids`), up to TOOLQ_LIMITS_MAX_PIDS.",
    )
    cpu: float | None = Field(
        None,
        gt=0,
        description="run_bash CPU limit: the CPUs a command's processes may use together "
        "(0.5: half of one), held by the call's control group (CFS bandwidth: a cgroup v2 cpu "
        "controller enabled for the worker, else a cgroup v1 cpu hierarchy) and by a run's "
        "container. Unset: no limit. A run may ask for its own (`limits.cpu`), up to "
        "TOOLQ_LIMITS_MAX_CPU.",
    )
    file_size_mb: int = Field(256, gt=0, description="run_bash largest file written.")
    cgroup: CgroupMode = Field(
        "auto",
        description="Control groups for run_bash: auto takes each job from v2, else v1; v2 or "
        "v1 use only that version; off uses rlimits alone.",
    )
    cgroup_root: Path = Field(
        Path("/sys/fs/cgroup"), description="Where the cgroup file systems are mounted."
    )

    def limited(self, limits: RunLimits | None) -> SandboxSettings:
        """These settings with a run's own memory, process and CPU limits, where it asks."""
        if limits is None:
            return self
        asked = {"memory_mb": limits.memory_mb, "max_processes": limits.pids, "cpu": limits.cpu}
        update = {name: value for name, value in asked.items() if value is not None}
        return self.model_copy(update=update) if update else self

    @model_validator(mode="before")
    @classmethod
    def _not_the_marker(cls, data: Any) -> Any:
        # TOOLQ_SANDBOX_ID marks a command's processes; a worker started from one is no error.
        if isinstance(data, dict) and _MARKER_FIELD in data:
            data = {key: value for key, value in data.items() if key != _MARKER_FIELD}
        return data

    @field_validator("uid_range")
    @classmethod
    def _a_uid_range(cls, text: str) -> str:
        if text.strip():
            UidRange.parse(text)
        return text.strip()

    @property
    def uids(self) -> UidRange | None:
        """The uids runs take, one each; None: every run is ``user``."""
        return UidRange.parse(self.uid_range) if self.uid_range else None
