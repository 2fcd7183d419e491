"""This worker's boxes, made once per process from its settings."""

from __future__ import annotations

import functools
import os

from worker.contract.errors import ImageError
from worker.contract.image_sources import ImageSources
from worker.contract.settings import WorkerSettings, get_worker_settings
from worker.images.boxes import Boxes, BoxSettings
from worker.images.fetch import Tools
from worker.images.spec import CONTAINER_IDS


def box_settings(settings: WorkerSettings) -> BoxSettings:
    """How this worker makes boxes; ``ImageError`` when it cannot make any: a run's box needs
    root and a uid of the run's own (``TOOLQ_SANDBOX_UID_RANGE``)."""
    uids = settings.sandbox.uids
    if os.geteuid() != 0 or uids is None:
        raise ImageError(
            "",
            "this sandbox worker cannot run images: it needs to be root with "
            "TOOLQ_SANDBOX_UID_RANGE set, so that each run's container has a uid of its own",
        )
    # The ids a box maps besides its user's: the block just past the runs' own uids.
    block = uids.last + 1
    if block + CONTAINER_IDS > 2**32 - 1:
        raise ImageError(
            "",
            f"TOOLQ_SANDBOX_UID_RANGE={uids} leaves no room past it for the {CONTAINER_IDS:,} "
            "ids a container maps",
        )
    return BoxSettings(
        cache_root=settings.image_cache,
        cache_bytes=settings.image_cache_bytes,
        runtime=settings.oci_runtime,
        tools=Tools(settings.registry_auth_file, tuple(settings.insecure_registries)),
        sandbox=settings.sandbox,
        id_block=block,
        sources=ImageSources.parse(settings.image_sources),
        tag_ttl_s=settings.image_tag_ttl_s,
    )


@functools.lru_cache(maxsize=1)
def worker_boxes() -> Boxes:
    """The boxes of this worker (``ImageError`` where it cannot make any)."""
    return Boxes(box_settings(get_worker_settings()))
