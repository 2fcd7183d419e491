"""What the sandbox is told, and what its parts share: the configuration, the error, the
command's environment and the time bound on killing it."""

from __future__ import annotations

import os
import pwd
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal, get_args

from worker.capping import DEFAULT_OUTPUT_CAP_BYTES

if TYPE_CHECKING:
    from worker.settings import WorkerSettings

Isolation = Literal["auto", "namespaces", "process"]
#: Which control groups run_bash may use: ``auto`` takes each job (killing, CPU accounting, the
#: process limit, the memory limit) from cgroup v2 where v2 offers it, else from v1; ``v2`` and
#: ``v1`` use only that version; ``off`` uses none (rlimits alone).
CgroupMode = Literal["auto", "v2", "v1", "off"]
#: Where cgroup file systems are mounted.
CGROUP_ROOT = "/sys/fs/cgroup"

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"
#: What every command's environment holds, besides its HOME and PWD and the caller's variables.
COMMAND_ENV = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
#: Marks every process of one command (when no PID namespace collects them) so that those
#: that left its session can still be found and killed.
MARKER_VARIABLE = "TOOLQ_SANDBOX_ID"
#: How long killed processes may take to be gone before we stop waiting for them.
REAP_BOUND_S = 5.0


class SandboxError(RuntimeError):
    """The sandbox cannot run commands as configured; the message says why."""


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How commands are isolated and limited."""

    user: str = "nobody"
    isolation: Isolation = "auto"
    memory_mb: int = 1024
    max_processes: int = 256
    file_size_mb: int = 256
    output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
    cgroup: CgroupMode = "auto"
    cgroup_root: str = CGROUP_ROOT
    #: Where the runs' folders are: a root worker's ready launches wait there, already the
    #: sandbox user's, and enter a call's folder by its path from there. None: each call drops
    #: to the sandbox user itself.
    workspace_root: str | None = None

    def __post_init__(self) -> None:
        if self.isolation not in get_args(Isolation):
            raise ValueError(
                f"sandbox isolation must be one of {', '.join(get_args(Isolation))}, "
                f"not {self.isolation!r}"
            )
        if self.cgroup not in get_args(CgroupMode):
            raise ValueError(
                f"sandbox cgroup must be one of {', '.join(get_args(CgroupMode))}, "
                f"not {self.cgroup!r}"
            )
        for field in ("memory_mb", "max_processes", "file_size_mb", "output_cap_bytes"):
            if getattr(self, field) <= 0:
                raise ValueError(f"sandbox {field} must be positive")

    def workspace_owner(self) -> tuple[int, int] | None:
        """The (uid, gid) that must own workspaces so that commands can write them: the
        sandbox user's, when this process is root (commands then run as that user)."""
        if os.geteuid() != 0:
            return None
        try:
            entry = pwd.getpwnam(self.user)
        except KeyError:
            return None  # the sandbox refuses to run, and says why, at the first command
        return entry.pw_uid, entry.pw_gid

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> SandboxConfig:
        return cls(
            user=settings.sandbox_user,
            isolation=settings.sandbox_isolation,
            memory_mb=settings.sandbox_memory_mb,
            max_processes=settings.sandbox_max_processes,
            file_size_mb=settings.sandbox_file_size_mb,
            output_cap_bytes=settings.output_cap_bytes,
            cgroup=settings.sandbox_cgroup,
            cgroup_root=str(settings.sandbox_cgroup_root),
            workspace_root=str(settings.workspace_root),
        )
