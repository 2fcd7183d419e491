"""Which digest a reference names, asking its registry only when the cache cannot answer.

A registry outage must not stop runs of an image the cache holds:

- a reference by digest (``x@sha256:...``) is that digest: the registry is never asked;
- a tag resolved less than ``TOOLQ_IMAGE_TAG_TTL_S`` ago is the digest it resolved to then;
- a tag resolved longer ago is asked again; when the registry cannot be reached (no
  connection, a timeout, a 5xx answer) and the cache holds the image the tag last named, that
  image is used, as Docker runs its local tag when a pull fails (unless ``--pull always``). A
  registry that answers, refusing the pull or not knowing the tag, is believed.

What each tag last resolved to is kept in the cache, shared by the worker's processes:

```
<cache>/tags/<hex>.json   {"reference", "digest", "resolved_at"}: <hex> hashes the tag's name
```
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

from pydantic import BaseModel

from worker.contract.image_reference import ImageReference
from worker.exceptions import RegistryUnreachable
from worker.images.fetch import Tools

log = logging.getLogger(__name__)

#: The longest a registry that does not answer is waited for when the cache has the tag's
#: image: the run starts from the cache rather than spend its call's time on it.
OUTAGE_PATIENCE_S = 15.0


class TagRecord(BaseModel):
    """What a tag resolved to, and when (epoch seconds)."""

    reference: str
    digest: str
    resolved_at: float


class TagResolver:
    """Digests of references, from ``tools`` or from what ``root`` remembers of a tag.
    ``cached(digest)`` says whether the image cache holds that image."""

    def __init__(
        self, root: Path, ttl_s: float, tools: Tools, cached: Callable[[str], bool]
    ) -> None:
        self.folder = root / "tags"
        self.ttl_s = ttl_s
        self.tools = tools
        self._cached = cached

    def resolve(self, ref: ImageReference, deadline: float) -> str:
        if ref.transport != "docker":
            return self.tools.resolve(ref, deadline)  # a local file: nothing to wait for
        if ref.digest is not None:
            return ref.digest
        known = self.recall(ref)
        usable = known is not None and self._cached(known.digest)
        if known is not None and usable and time.time() - known.resolved_at < self.ttl_s:
            return known.digest
        asking = min(deadline, time.monotonic() + OUTAGE_PATIENCE_S) if usable else deadline
        try:
            digest = self.tools.resolve(ref, asking)
        except RegistryUnreachable as exc:
            if known is None or not usable:
                raise
            log.warning(
                "%s: the registry cannot be reached (%s); running the cached %s it named %.0f s "
                "ago",
                ref.text,
                exc.cause,
                known.digest,
                time.time() - known.resolved_at,
            )
            return known.digest
        self.remember(ref, digest)
        return digest

    def recall(self, ref: ImageReference) -> TagRecord | None:
        try:
            return TagRecord.model_validate_json(self._path(ref).read_bytes())
        except (OSError, ValueError):
            return None

    def remember(self, ref: ImageReference, digest: str) -> None:
        """Written whole (a file renamed into place): another process reads the old or the new."""
        self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        record = TagRecord(reference=ref.for_skopeo(), digest=digest, resolved_at=time.time())
        path = self._path(ref)
        work = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}")
        try:
            work.write_text(record.model_dump_json())
            os.replace(work, path)
        except OSError as exc:
            work.unlink(missing_ok=True)
            log.warning("%s: cannot remember the digest of its tag: %s", ref.text, exc)

    def _path(self, ref: ImageReference) -> Path:
        # The name skopeo reads: "python:3.12" and "docker.io/library/python:3.12" are one tag.
        name = hashlib.sha256(ref.for_skopeo().encode()).hexdigest()
        return self.folder / f"{name}.json"
