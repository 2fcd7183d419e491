"""The operator's allowlist of image sources (``TOOLQ_IMAGE_SOURCES``), held on the sandbox
worker before anything of an image is looked at: no connection to a registry it does not name,
no file opened outside a folder it names."""

from __future__ import annotations

import os

from worker.contract.image_reference import LOCAL_TRANSPORTS, ImageReference
from worker.contract.image_sources import ImageSources, is_below, refusal


def check_source(ref: ImageReference, sources: ImageSources) -> None:
    """``ImageError``, the same line whatever is there, unless ``sources`` is unset or names
    ``ref``. A local image's path is named only if it stays in a named folder once its links
    are followed (a link in the folder to a file outside it is outside)."""
    if not sources.is_set:
        return
    if not sources.names(ref):
        raise refusal(ref)
    if ref.transport in LOCAL_TRANSPORTS:
        real = os.path.realpath(ref.location)
        if not any(is_below(real, os.path.realpath(f)) for f in sources.folders(ref)):
            raise refusal(ref)
