"""A uid and gid of its own for every run: the kernel, not path checks, keeps runs apart.

Each run's workspace belongs to a uid taken from ``TOOLQ_SANDBOX_UID_RANGE`` and is closed to
every other (mode 0700); the run's commands run as that uid and its own gid, with no other group.
A command of one run can then neither list, read nor write another run's files, whatever their
modes, nor signal or trace another run's processes or the worker's, nor read their environment.

A uid is claimed for a run twice. The fleet's claim, ``<root>/.toolq/uids/<uid>`` (``O_EXCL``:
one winner however many workers on however many hosts share the volume), holds the run's id. The
host's claim (``host_registry``, shared by every fleet on the host) names the fleet and the run: a
uid another fleet holds on this host is skipped, so two fleets never hand one uid to two runs. The
first uid tried is a hash of the run id keyed by the fleet's secret (``fleet_key``): a run found at
once, and no run can aim at another's uid by the id it picks; on a collision the next free one is
taken. Both claims are let go with the workspace (``release``), when no process of the uid is left.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
from pathlib import Path

from worker.contract.uid_range import UidRange
from worker.exceptions import HostRegistryError, IdentityError
from worker.sandbox.fleet_key import first_uid_offset, fleet_id
from worker.sandbox.host_registry import HOST_STATE, HostRegistry
from worker.sandbox.names import names_folder
from worker.sandbox.uid_reset import reset_uid
from worker.sandbox.uid_use import forget_use, was_used
from worker.state_folder import STATE_DIR

log = logging.getLogger(__name__)

CLAIMS = "uids"
TMP = "tmp"
#: What a claim kept aside holds before the id of the run that left its uid unclean.
QUARANTINED = b"quarantined:"
#: The most claims looked at before the range is called full: probing is linear from the hash.
_PROBES = 4096


def claims_dir(root: Path) -> Path:
    return Path(root) / STATE_DIR / CLAIMS


def identity_of(
    root: Path, run_id: str, uids: UidRange, host_state: str | Path = HOST_STATE
) -> tuple[int, int]:
    """The (uid, gid) of ``run_id``'s workspace under ``root``: the one it holds, or a free one
    claimed now, for the fleet and on this host (``host_state``, the host's registry). Raises
    ``IdentityError`` when none can be had."""
    claims = claims_dir(root)
    _ensure_private(claims)
    try:
        fleet = fleet_id(root)
        start = first_uid_offset(root, run_id, uids.size)
    except OSError as exc:
        raise IdentityError(f"cannot read the fleet's key under {root}: {exc}") from exc
    host = HostRegistry(host_state)
    wanted = run_id.encode()
    for step in range(min(_PROBES, uids.size)):
        uid = uids.first + (start + step) % uids.size
        claim = claims / str(uid)
        holder = _holder(claim)
        if holder == wanted and _on_this_host(host, uid, fleet, run_id, root):
            return uid, uid  # the run's, as every later call finds it
        if holder not in (None, b"", wanted):
            continue  # another run's
        try:
            with host.claiming():
                if _claim(claim, wanted, host, uid, fleet, run_id, root):
                    return uid, uid
        except HostRegistryError as exc:
            raise IdentityError(f"cannot claim uid {uid} for run {run_id} here: {exc}") from exc
    raise IdentityError(
        f"no free uid for run {run_id}: the {min(_PROBES, uids.size)} uids tried from "
        f"TOOLQ_SANDBOX_UID_RANGE={uids} are all taken; widen the range or prune workspaces"
    )


def _claim(
    claim: Path, wanted: bytes, host: HostRegistry, uid: int, fleet: str, run_id: str, root: Path
) -> bool:
    """Whether ``uid`` is the run's: claimed now for the fleet and this host, or found claimed
    so. Made while this host's processes claim nothing else (``HostRegistry.claiming``): a
    claim let go because another fleet holds the uid here is gone before anyone here reads it.
    """
    try:
        fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except FileExistsError:
        if _holder(claim) != wanted:
            return False  # another run's, claimed meanwhile
        if _on_this_host(host, uid, fleet, run_id, root):
            return True
        raise IdentityError(
            f"run {run_id} holds uid {uid}, which another fleet holds on this host; run its "
            "calls on another host, or give the fleets ranges apart (TOOLQ_SANDBOX_UID_RANGE)"
        ) from None
    except OSError as exc:
        where = claim.parent
        raise IdentityError(f"cannot claim a uid for run {run_id} in {where}: {exc}") from exc
    try:
        os.write(fd, wanted)
    finally:
        os.close(fd)
    if _on_this_host(host, uid, fleet, run_id, root):
        return True
    claim.unlink()  # another fleet's on this host: the next one
    return False


def _on_this_host(host: HostRegistry, uid: int, fleet: str, run_id: str, root: Path) -> bool:
    try:
        return host.claim_uid(uid, fleet, run_id, str(root))
    except (HostRegistryError, OSError) as exc:
        raise IdentityError(f"cannot claim uid {uid} for run {run_id} on this host: {exc}") from exc


def run_tmp(root: Path, key: str) -> Path:
    """The folder that is /tmp (and /var/tmp) to the commands of the run named ``key`` under
    ``root``, where they have a mount namespace: it lasts as long as the run's workspace."""
    name = key if "/" not in key else hashlib.sha256(key.encode()).hexdigest()[:32]
    return Path(root) / STATE_DIR / TMP / name


def make_run_tmp(root: Path, key: str, gid: int) -> str:
    """``run_tmp``, made if missing: the worker's, open to the run's group alone, sticky."""
    folder = run_tmp(root, key)
    if not folder.is_dir():
        folder.mkdir(parents=True, exist_ok=True)
        os.chown(folder, os.geteuid(), gid)
        os.chmod(folder, 0o1770)  # noqa: S103 - the run's group alone, as /tmp is
    return str(folder)


def release(root: Path, run_id: str, uid: int, host_state: str | Path = HOST_STATE) -> None:
    """Let ``uid`` go, if ``run_id`` holds it (its workspace was removed): its /tmp goes, and
    all the uid left in the kernel and at the top of this host's shared folders (``reset_uid``),
    where anything ran as the uid since its last reset (``uid_use``).
    A uid kept aside stays claimed on this host too: what is left of it is this host's."""
    shutil.rmtree(run_tmp(root, run_id), ignore_errors=True)
    shutil.rmtree(names_folder(Path(root) / STATE_DIR, run_id), ignore_errors=True)
    claim = claims_dir(root) / str(uid)
    if _holder(claim) == run_id.encode():
        if _another_fleets_here(root, uid, host_state):
            # The run held the uid on another host: here the uid and all it has are another
            # fleet's run's, which nothing of this release may touch.
            claim.unlink(missing_ok=True)
            return
        if was_used(root, uid):
            left = reset_uid(uid)
            if left:
                # Kept aside, held by no run: handed on, it would carry the old run's state.
                log.warning("uid %d is quarantined, not freed: %s is left", uid, "; ".join(left))
                claim.write_bytes(QUARANTINED + run_id.encode())
                return
            # Before the claim goes: the uid's next holder notes its own use.
            forget_use(root, uid)
        # Else nothing ever ran as the uid (``uid_use``): the kernel holds nothing of it.
        claim.unlink(missing_ok=True)
        # Where this process cannot reach the host's registry, the claim made there stays
        # until a run of this fleet takes the uid again (``HostRegistry.claim_uid``): other
        # fleets skip it meanwhile, which is the safe side.
        with contextlib.suppress(HostRegistryError, OSError):
            HostRegistry(host_state).release_uid(uid, fleet_id(root), run_id)


def _another_fleets_here(root: Path, uid: int, host_state: str | Path) -> bool:
    """Whether this host's registry says another fleet holds ``uid`` here."""
    try:
        holder = HostRegistry(host_state).uid_holder(uid)
        return holder is not None and holder.fleet != fleet_id(root)
    except (HostRegistryError, OSError):
        return False  # no registry here, or no key: no fleet can have claimed it here


def _holder(claim: Path) -> bytes | None:
    try:
        with open(claim, "rb") as file:
            return file.read(8192)  # a run id, or a folder's real path
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno in (errno.ENOTDIR, errno.ELOOP):
            return None
        raise


def _ensure_private(claims: Path) -> None:
    """The claims, and the state folder above them, are the workers' alone."""
    if claims.is_dir():
        return
    claims.mkdir(parents=True, exist_ok=True)
    for folder in (claims.parent, claims):
        with contextlib.suppress(PermissionError):
            os.chmod(folder, 0o700)
