"""What the sandbox is told, and what its parts share: the configuration, the error, the
command's environment and the time bound on killing it."""

from __future__ import annotations

import os
import pwd
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING

from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.contract.run_limits import RunLimits
from worker.contract.sandbox_settings import (
    HOST_STATE,
    CgroupMode,
    HostHardening,
    Isolation,
    SandboxSettings,
)
from worker.contract.uid_range import UidRange
from worker.exceptions import SandboxError
from worker.sandbox.fleet_key import fleet_id
from worker.sandbox.host_registry import default_host_state
from worker.sandbox.identity import identity_of, make_run_tmp
from worker.sandbox.names import make_run_names, names_folder
from worker.sandbox.uid_use import note_used
from worker.state_folder import STATE_DIR

if TYPE_CHECKING:
    from worker.contract.settings import WorkerSettings

__all__ = ["CgroupMode", "HostHardening", "Isolation", "SandboxConfig", "SandboxError"]

SAFE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
SHELL = "/bin/sh"
#: What every command's environment holds, besides its HOME and PWD and the caller's variables.
COMMAND_ENV = {"PATH": SAFE_PATH, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
#: Marks every process of one command (when no PID namespace collects them) so that those
#: that left its session can still be found and killed.
MARKER_VARIABLE = "TOOLQ_SANDBOX_ID"
#: Where a command's input waits for it (``run_sandboxed``'s ``stdin``), one file per call.
INPUT_FOLDER = Path(tempfile.gettempdir()) / "toolq-inputs"
#: How long killed processes may take to be gone before we stop waiting for them.
REAP_BOUND_S = 5.0


@dataclass(frozen=True, slots=True)
class SandboxConfig:
    """How commands are isolated and limited: the sandbox's settings as the operator gave them
    (``TOOLQ_SANDBOX_*``), with the worker's facts the sandbox needs beside them."""

    settings: SandboxSettings = field(default_factory=SandboxSettings)
    output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
    #: Where the runs' folders are: a root worker's ready launches wait there, already the
    #: sandbox user's, and enter a call's folder by its path from there. None: each call drops
    #: to the sandbox user itself. Per-run uids are claimed below it (``identity``).
    workspace_root: str | None = None
    #: Each run's workspace is a file system of this many bytes (``volumes``); 0: none.
    volume_bytes: int = 0
    #: The limits in ``settings`` are a run's own (``with_limits``), not the worker's.
    run_limits: bool = False

    def with_limits(self, limits: RunLimits | None) -> SandboxConfig:
        """This configuration with a run's own memory, process and CPU limits, where it asks."""
        settings = self.settings.limited(limits)
        if settings is self.settings:
            return self
        return replace(self, settings=settings, run_limits=True)

    @property
    def uid_range(self) -> UidRange | None:
        """The uids runs take, one each (``worker.sandbox.identity``); None: every run is the
        sandbox user."""
        return self.settings.uids

    @property
    def host_state(self) -> str:
        """The host's registry every sandbox worker on the host shares (``host_registry``):
        the default is a folder of the worker user's own when it is not root."""
        chosen = self.settings.host_state
        return default_host_state() if chosen == HOST_STATE else str(chosen)

    @property
    def per_run_uids(self) -> bool:
        """Each run's commands run as a uid of its own: the worker is root and has a range."""
        return self.uid_range is not None and os.geteuid() == 0

    def workspace_owner(self, folder: Path) -> tuple[int, int] | None:
        """The (uid, gid) that must own the workspace ``folder`` so that its commands can write
        it, when this process is root (commands then run as that user): the run's own
        (``identity``), or with runs sharing one uid the sandbox user's."""
        if os.geteuid() != 0:
            return None
        if self.uid_range is not None:
            root, key = self._claims_for(folder)
            return identity_of(root, key, self.uid_range, self.host_state)
        try:
            entry = pwd.getpwnam(self.settings.user)
        except KeyError:
            return None  # the sandbox refuses to run, and says why, at the first command
        return entry.pw_uid, entry.pw_gid

    def sharing_refusal(self) -> str | None:
        """Why a sandbox worker with this configuration must not start (its runs would share
        one uid and could reach each other's files and processes), or None. The operator may
        allow it with ``TOOLQ_SANDBOX_SHARED=allow``."""
        if self.per_run_uids or self.settings.shared == "allow":
            return None
        if os.geteuid() != 0:
            why = (
                "this worker is not root, so it cannot give each run a uid of its own (run it "
                "as root, or as root in a user namespace as deploy/ does)"
            )
        else:
            why = "TOOLQ_SANDBOX_UID_RANGE is empty, so every run would be one user"
        return (
            f"the sandbox cannot keep runs apart: {why}; to let runs share one uid anyway, "
            "set TOOLQ_SANDBOX_SHARED=allow"
        )

    def volume_refusal(self) -> str | None:
        """Why the run volumes asked for (``TOOLQ_WORKSPACE_QUOTA_FS=loop``) cannot be had."""
        if not self.volume_bytes:
            return None
        from worker.sandbox.volumes import volumes_unavailable

        why = volumes_unavailable() if self.per_run_uids else "runs share one uid"
        if why is None:
            return None
        return f"TOOLQ_WORKSPACE_QUOTA_FS=loop cannot be had here: {why}"

    def fleet(self) -> str:
        """This worker's fleet, as the host's registry names it (``fleet_key``)."""
        root = self.workspace_root
        return fleet_id(None if root is None else Path(os.path.realpath(root)))

    def run_tmp_for(self, folder: Path, gid: int) -> str:
        """The folder that is /tmp to the commands of the run working in ``folder`` (made if
        missing): it lasts as long as the run's workspace (``identity.release``)."""
        root, key = self._claims_for(folder)
        return make_run_tmp(root, key, gid)

    def note_uid_used(self, folder: Path, uid: int) -> None:
        """Note, before anything runs as ``uid``, the uid of the run working in ``folder``,
        that it was used (``uid_use``): its release then resets it."""
        root, _ = self._claims_for(folder)
        note_used(root, uid)

    def run_names_for(self, folder: Path, uid: int, gid: int) -> tuple[tuple[str, str], ...]:
        """The (source, target) pairs that give the uid of the run working in ``folder`` a name
        in its view (``worker.sandbox.names``), the files made if missing."""
        root, key = self._claims_for(folder)
        return make_run_names(names_folder(root / STATE_DIR, key), uid, gid, str(folder))

    def _claims_for(self, folder: Path) -> tuple[Path, str]:
        """Where ``folder``'s uid is claimed, and by what name: a run's folder by its run id
        under the workspace root, any other folder by its real path there too."""
        real = Path(os.path.realpath(folder))
        if self.workspace_root is None:
            return real.parent, real.name
        root = Path(os.path.realpath(self.workspace_root))
        return root, (real.name if real.parent == root else str(real))

    @classmethod
    def from_settings(cls, settings: WorkerSettings) -> SandboxConfig:
        quota_fs = settings.workspace_quota_fs == "loop"
        return cls(
            settings.sandbox,
            output_cap_bytes=settings.output_cap_bytes,
            workspace_root=str(settings.workspace_root),
            volume_bytes=settings.workspace_quota_bytes if quota_fs else 0,
        )
