"""What a box is inside, decided before its runtime starts it: who runs in it, where the run's
workspace is mounted, and its first process."""

from __future__ import annotations

import contextlib
import os
import shutil
from pathlib import Path

from worker.contract.errors import ImageError
from worker.images.cache import CachedImage
from worker.images.rootfs import lookup_user
from worker.images.runtime import OciRuntime

#: Where the workspace is in a box whose image names no WorkingDir of its own.
DEFAULT_WORKDIR = "/workspace"
#: catatonit, the box's first process (Debian's package; podman's init).
INIT_CANDIDATES = ("/usr/bin/catatonit", "/usr/libexec/podman/catatonit")


def box_user(
    image: str, cached: CachedImage, view: Path, runtime: OciRuntime, user: str | None
) -> tuple[int, int]:
    """Who runs in the box: ``user``, else the image's User. gVisor's file server reaches the
    workspace as the box's root: under runsc that root is the run's own uid and the box's
    commands run as it, whatever user the image names (one asked for is refused). ``view``:
    the image's files (``worker.images.mounts.image_view``)."""
    try:
        inside = lookup_user(view, user if user is not None else cached.record.user)
    except ValueError as exc:
        raise ImageError(image, str(exc)) from None
    if runtime.gvisor and inside[0] != 0:
        if user is not None:
            raise ImageError(
                image,
                f"the user {user!r} is not root: with TOOLQ_OCI_RUNTIME=runsc a run's commands "
                "run as the container's root",
            )
        return 0, 0
    return inside


def protect_from_oom(pid: int) -> None:
    """The init holds the box: a memory hog of a call is killed before it. Set from here (the
    box's own root may not lower it), where the worker may (CAP_SYS_RESOURCE)."""
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/oom_score_adj").write_text("-999")


def box_workdir(image_workdir: str) -> str:
    """Where the workspace is mounted: the image's WorkingDir, or /workspace without one."""
    cleaned = os.path.normpath("/" + image_workdir.strip()) if image_workdir.strip() else "/"
    return DEFAULT_WORKDIR if cleaned == "/" else cleaned


def init_binary(image: str) -> str:
    """The host's catatonit, which a box's first process is."""
    for candidate in INIT_CANDIDATES:
        if os.access(candidate, os.X_OK):
            return candidate
    found = shutil.which("catatonit")
    if found is None:
        raise ImageError(
            image,
            "catatonit, the container's first process, is not installed on the sandbox worker "
            "(Debian's catatonit package)",
        )
    return found
