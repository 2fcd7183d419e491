"""The host's sysctls that keep runs apart in a shared /tmp.

Without a mount namespace (``TOOLQ_SANDBOX_ISOLATION=process``, or ``auto`` where namespaces do
not work) every run's commands use the host's /tmp and /var/tmp. There a run can plant a file
open to all, or a symlink, under a name another run will write: the kernel refuses the second
run's ``O_CREAT`` open of a file it does not own in a sticky world-writable folder only with
``fs.protected_regular``, and refuses to follow a symlink there that another uid owns only with
``fs.protected_symlinks``. Most distributions turn both on; a host with them off is a host where
one run's writes can land in another's files.

A sandbox worker checks them as it starts: as root it turns them on (and says so), unless the
operator said only to check (``TOOLQ_SANDBOX_HOST_HARDENING=check``); where they stay off it
refuses to start, in one line, unless the operator allowed it (``off``). The sysctls are the
host's, for every program on it: the same values systemd's defaults set.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from pathlib import Path

from worker.exceptions import SandboxError
from worker.sandbox.config import SandboxConfig
from worker.sandbox.layers import LAYER_TMP_CLEANED, plan_for

log = logging.getLogger(__name__)

#: Where the kernel's sysctls are.
SYSCTL_ROOT = Path("/proc/sys")
#: The sysctls runs sharing /tmp need, and the least value of each that keeps them apart
#: (``fs.protected_regular=2`` also covers group-writable sticky folders: no run shares a group).
NEEDED = {"fs.protected_regular": 1, "fs.protected_symlinks": 1}
#: The setting that tells a worker what to do about them.
SETTING = "TOOLQ_SANDBOX_HOST_HARDENING"


def shares_host_tmp(config: SandboxConfig) -> bool:
    """The runs of a worker with ``config`` have uids of their own but share the host's /tmp."""
    if not config.per_run_uids:
        return False
    # Whether /tmp is shared does not depend on control groups: the plan is made without them,
    # so that nothing is made in the cgroup hierarchy by the worker's first process.
    try:
        plan = plan_for(
            dataclasses.replace(
                config, settings=config.settings.model_copy(update={"cgroup": "off"})
            ),
            os.geteuid(),
        )
    except SandboxError:
        return False  # the worker says why at its first command
    return LAYER_TMP_CLEANED in plan.layers


def hardening_refusal(config: SandboxConfig, sysctls: Path = SYSCTL_ROOT) -> str | None:
    """Why a worker with ``config`` must not start on this host (its runs share /tmp and the
    sysctls that keep them apart there are off, and stay off), or None. With ``set``, turns
    them on first, saying so in the log. ``sysctls``: where the sysctls are read and written."""
    if config.settings.host_hardening == "off" or not shares_host_tmp(config):
        return None
    low = {name: value for name, value in _read(sysctls).items() if value < NEEDED[name]}
    if not low:
        return None
    shown = ", ".join(f"{name}={'unknown' if value < 0 else value}" for name, value in low.items())
    if config.settings.host_hardening == "set":
        failure = _write(sysctls, low)
        if failure is None:
            wanted = ", ".join(f"{name}={NEEDED[name]}" for name in low)
            log.warning(
                "set %s on this host (it had %s): runs without namespaces share /tmp and "
                "/var/tmp; %s=check leaves the host as it is",
                wanted,
                shown,
                SETTING,
            )
            return None
        why = f"this worker cannot set them ({failure})"
    else:
        why = f"{SETTING}=check leaves them to the operator"
    commands = " ".join(f"{name}={NEEDED[name]}" for name in low)
    return (
        f"runs without namespaces share /tmp and /var/tmp, where this host's {shown} let one "
        f"run's planted file or symlink take another run's writes, and {why}; set them "
        f"(sysctl -w {commands}), or to start anyway set {SETTING}=off"
    )


def _read(sysctls: Path) -> dict[str, int]:
    """Each needed sysctl's value; -1 where it cannot be read (a kernel without it)."""
    values = {}
    for name in NEEDED:
        try:
            values[name] = int(_path(sysctls, name).read_text().strip())
        except (OSError, ValueError):
            values[name] = -1
    return values


def _write(sysctls: Path, low: dict[str, int]) -> str | None:
    """Set each of ``low`` to its needed value; why one could not be set, or None."""
    for name in low:
        try:
            _path(sysctls, name).write_text(f"{NEEDED[name]}\n")
        except OSError as exc:
            return f"{name}: {exc.strerror or exc}"
    return None


def _path(sysctls: Path, name: str) -> Path:
    return sysctls.joinpath(*name.split("."))
