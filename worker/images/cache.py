"""The image cache of a sandbox worker (``TOOLQ_IMAGE_CACHE``): each layer unpacked once per
host, by diff id, shared by the images that have it and by the worker's processes; bounded by
``TOOLQ_IMAGE_CACHE_BYTES`` (every layer counted once).

```
<cache>/images/<hex>/image.json  what toolq keeps of an image (``ImageRecord``): its layers
<cache>/images/<hex>/used        touched when a container starts from it: the LRU clock
<cache>/layers/<hex>/root        a layer's files, never written after (``layer_store``)
<cache>/pulls/<hex>.lock         held while one process pulls that digest; the others wait
<cache>/tags/<hex>.json          what a tag last resolved to, and when (``worker.images.tags``)
<cache>/lock                     held while images are counted, claimed or evicted
```

An image is pulled into a folder of its own under ``pulls/``: only the layers the cache has not
are unpacked there, and they and the image's record are moved into place together, under the
cache's lock, so a process killed mid-pull leaves no half image (only a folder the next sweep
removes). Before a layer is unpacked, what the new layers unpack to is counted
(``worker.images.layers``), stopping at the bound less the layers of images containers use: an
image past it is refused with nothing unpacked, saying which limit. When a new image does not
fit, the least recently used images that no container uses are removed first, and with them the
layers no other image has; when even that is not enough the pull fails, saying the cache is
full of images in use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path

from pydantic import BaseModel

from worker.contract.errors import ImageError, ToolqError
from worker.contract.image_reference import ImageReference
from worker.exceptions import TooLarge
from worker.images.fetch import Tools, image_config, image_layers
from worker.images.layer_store import LayerStore, disk_usage
from worker.images.layers import readable_size, unpacked_bytes
from worker.images.locks import held_lock
from worker.images.mounts import image_view, unmount_below
from worker.images.rootfs import has_shell
from worker.images.tags import TagResolver

#: How long a tag's digest is believed without asking its registry (``TOOLQ_IMAGE_TAG_TTL_S``).
DEFAULT_TAG_TTL_S = 600.0
#: Between two looks at a lock another process holds.
_LOCK_POLL_S = 0.05
#: How long a sweep waits for the cache's lock to remove unused layers.
_COLLECT_WAIT_S = 1.0


class ImageRecord(BaseModel):
    """One unpacked image: what a container of it needs from its configuration."""

    digest: str
    #: The reference it was first pulled by.
    reference: str
    size_bytes: int
    env: list[str]
    user: str
    workdir: str
    #: Its layers' diff ids, bottom first (none: a cache of before layers were shared).
    layers: list[str] = []


class CachedImage:
    """An image in the cache: its record and its layers' files, bottom first."""

    def __init__(self, folder: Path, record: ImageRecord, layer_roots: list[Path]) -> None:
        self.folder = folder
        self.record = record
        self.layer_roots = layer_roots


class _LayerGone(ToolqError):
    """A layer the pull counted on was removed (its last image evicted) before it was placed."""


class ImageCache:
    """``root``, bounded by ``bound`` bytes of unpacked images. ``in_use`` tells which digests
    live containers use: those are never evicted."""

    def __init__(
        self,
        root: Path,
        bound: int,
        tools: Tools,
        in_use: Callable[[], set[str]],
        tag_ttl_s: float = DEFAULT_TAG_TTL_S,
    ) -> None:
        self.root = root
        self.bound = bound
        self.tools = tools
        self._in_use = in_use
        self.layers = LayerStore(root)
        #: The digest a reference names: from the cache where it can tell, else its registry.
        self.tags = TagResolver(root, tag_ttl_s, tools, self._present)

    def acquire(
        self,
        ref: ImageReference,
        digest: str,
        deadline: float,
        claim: Callable[[CachedImage], None],
    ) -> tuple[CachedImage, bool]:
        """The image of ``digest``, pulled if missing, and ``claim`` called with it while no
        eviction can run (the claim marks it in use). Also whether it was pulled now."""
        pulled = False
        for _ in range(3):
            if not self._present(digest):
                pulled = self._pull(ref, digest, deadline) or pulled
            with self.locked(deadline, ref):
                image = self._load(digest)
                if image is None or not self._present(digest):
                    continue  # evicted between the pull and the claim: pull again
                (image.folder / "used").touch()
                claim(image)
                return image, pulled
        raise ImageError(ref.text, "it was evicted from the image cache as soon as it was pulled")

    def locked(
        self, deadline: float, ref: ImageReference | None = None
    ) -> AbstractContextManager[None]:
        """The cache's lock: counting, claiming and evicting happen under it."""
        self.root.mkdir(parents=True, exist_ok=True)
        lock = self.root / "lock"
        image = ref.text if ref else str(lock)
        return held_lock(lock, deadline, _LOCK_POLL_S, image, "the image cache is busy")

    def images(self) -> list[CachedImage]:
        folder = self.root / "images"
        entries = sorted(folder.iterdir()) if folder.is_dir() else []
        return [image for e in entries if (image := self._load_folder(e)) is not None]

    def remove_leftover_pulls(self) -> int:
        """Remove pulls that a process killed mid-pull left (their lock is free)."""
        pulls = self.root / "pulls"
        removed = 0
        for entry in list(pulls.iterdir()) if pulls.is_dir() else []:
            if not entry.is_dir():
                continue
            lock = pulls / f"{entry.name.split('.', 1)[0]}.lock"
            try:
                with held_lock(lock, time.monotonic(), _LOCK_POLL_S, str(lock), ""):
                    unmount_below(entry)
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
            except ImageError:
                continue  # a pull of that digest is under way
        with contextlib.suppress(ImageError):  # the cache is busy: the next sweep collects
            self.collect(time.monotonic() + _COLLECT_WAIT_S)
        _empty(self.layers.trash)
        return removed

    def _pull(self, ref: ImageReference, digest: str, deadline: float) -> bool:
        hex_digest = digest.partition(":")[2]
        pulls = self.root / "pulls"
        pulls.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "images").mkdir(mode=0o700, exist_ok=True)
        busy = "another pull of it is slow"
        with held_lock(pulls / f"{hex_digest}.lock", deadline, _LOCK_POLL_S, ref.text, busy):
            if self._present(digest):
                return False  # another process pulled it while this one waited
            work = pulls / f"{hex_digest}.{uuid.uuid4().hex[:8]}"
            try:
                work.mkdir()
                layout = work / "layout"
                # The blobs of cached layers are not fetched again.
                self.layers.link_blobs(layout)
                self.tools.copy(ref, digest, layout, deadline)
                for attempt in range(3):
                    try:
                        self._unpack(ref, digest, layout, work / f"unpack-{attempt}", deadline)
                        break
                    except _LayerGone:
                        continue
                else:
                    raise ImageError(ref.text, "the layers it shares kept being evicted")
            finally:
                unmount_below(work)
                shutil.rmtree(work, ignore_errors=True)
        return True

    def _unpack(
        self, ref: ImageReference, digest: str, layout: Path, work: Path, deadline: float
    ) -> None:
        """Unpack the layers of ``layout`` the cache has not, then place them and the image's
        record; ``_LayerGone`` when a layer it counted on was evicted meanwhile."""
        try:
            layers = image_layers(layout)
            config = image_config(layout)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImageError(ref.text, f"its configuration cannot be read: {exc}") from None
        held = {layer.diff_id for layer in layers if self.layers.present(layer.diff_id)}
        self._check_fits(ref, layout, held, deadline)
        work.mkdir()
        unpacked: dict[str, tuple[Path, int, str]] = {}
        roots = []
        for number, layer in enumerate(layers, 1):
            if layer.diff_id in held:
                roots.append(self.layers.root(layer.diff_id))
                continue
            if layer.diff_id not in unpacked:
                folder = work / f"layer-{number}"
                (folder / "root").mkdir(parents=True)
                self.tools.unpack_layer(ref, number, layer, folder / "root", deadline)
                os.link(layer.blob, folder / "blob")
                unpacked[layer.diff_id] = (folder, disk_usage(folder), layer.digest)
            roots.append(unpacked[layer.diff_id][0] / "root")
        with image_view(roots, work / "view") as view:
            if not has_shell(view):
                raise ImageError(
                    ref.text,
                    "it has no /bin/sh, which every command of a run goes through "
                    "(use an image with a shell)",
                )
        diff_ids = [layer.diff_id for layer in layers]
        with self.locked(deadline, ref):
            if not all(self.layers.present(d) or d in unpacked for d in diff_ids):
                raise _LayerGone
            new = {d: u for d, u in unpacked.items() if not self.layers.present(d)}
            self._make_room(ref, sum(size for _, size, _ in new.values()), set(diff_ids))
            for diff_id, (folder, size, blob) in new.items():
                self.layers.place(diff_id, folder, size, blob)
            sizes = self.layers.sizes()
            record = ImageRecord(
                digest=digest,
                reference=ref.text,
                size_bytes=sum(sizes.get(d, 0) for d in dict.fromkeys(diff_ids)),
                env=[str(e) for e in config.get("Env") or []],
                user=str(config.get("User") or ""),
                workdir=str(config.get("WorkingDir") or ""),
                layers=diff_ids,
            )
            image = work / "image"
            image.mkdir()
            (image / "image.json").write_text(record.model_dump_json())
            (image / "used").touch()
            target = self._folder(digest)
            if target.exists():
                self.layers.discard(target)  # an image of a cache from before layers were shared
            image.rename(target)

    def _check_fits(
        self, ref: ImageReference, layout: Path, present: set[str], deadline: float
    ) -> None:
        """Count what the copied image's layers the cache has not (``present``) unpack to,
        stopping at the room the cache can make for them (its bound less the layers of images
        containers use); ``ImageError`` naming the limit when they are past it, before anything
        is unpacked."""
        with self.locked(deadline, ref):
            used = self._in_use()
            in_use = {d for i in self.images() if i.record.digest in used for d in i.record.layers}
            held = sum(size for d, size in self.layers.sizes().items() if d in in_use)
        room = max(self.bound - held, 0)
        try:
            unpacked_bytes(ref.text, layout, room, present)
        except TooLarge as large:
            if large.counted > self.bound:
                raise ImageError(
                    ref.text,
                    f"its layers unpack to more than {readable_size(self.bound)} "
                    "(TOOLQ_IMAGE_CACHE_BYTES)",
                ) from None
            raise ImageError(
                ref.text,
                f"the image cache is full of images in use: its layers unpack to more than "
                f"the {readable_size(room)} left of {readable_size(self.bound)} "
                f"(TOOLQ_IMAGE_CACHE_BYTES); {readable_size(held)} hold images that running "
                "containers use",
            ) from None

    def _make_room(self, ref: ImageReference, size: int, keep: set[str]) -> None:
        """Evict least recently used images no container uses, and the layers no image left
        has (but ``keep``, the new image's), until ``size`` more bytes fit; ``ImageError`` when
        they cannot."""
        total = sum(self.layers.sizes().values())
        if total + size <= self.bound:
            return
        used = self._in_use()
        idle = sorted(
            (i for i in self.images() if i.record.digest not in used),
            key=lambda i: _mtime(i.folder / "used"),
        )
        for image in idle:
            self.layers.discard(image.folder)
            self._collect(keep)
            total = sum(self.layers.sizes().values())
            if total + size <= self.bound:
                return
        raise ImageError(
            ref.text,
            f"the image cache is full of images in use: it needs {size:,} bytes and "
            f"{total:,} of its {self.bound:,} bytes (TOOLQ_IMAGE_CACHE_BYTES) hold images "
            "that running containers use",
        )

    def collect(self, deadline: float) -> int:
        """Remove the layers no image has, and images of a cache from before layers were
        shared that no container uses (a pull or an eviction cut short leaves them); how many
        layers went. Under the cache's lock."""
        with self.locked(deadline):
            used = self._in_use()
            for image in self.images():
                if not image.record.layers and image.record.digest not in used:
                    self.layers.discard(image.folder)
            return self._collect(set())

    def _collect(self, keep: set[str]) -> int:
        wanted = set(keep)
        for image in self.images():
            wanted.update(image.record.layers)
        removed = 0
        for diff_id in self.layers.sizes():
            if diff_id not in wanted:
                self.layers.remove(diff_id)
                removed += 1
        return removed

    def _folder(self, digest: str) -> Path:
        return self.root / "images" / digest.partition(":")[2]

    def _present(self, digest: str) -> bool:
        image = self._load(digest)
        return (
            image is not None
            and bool(image.record.layers)
            and all(self.layers.present(d) for d in image.record.layers)
        )

    def _load(self, digest: str) -> CachedImage | None:
        return self._load_folder(self._folder(digest))

    def _load_folder(self, folder: Path) -> CachedImage | None:
        try:
            record = ImageRecord.model_validate_json((folder / "image.json").read_bytes())
        except (OSError, ValueError):
            return None
        return CachedImage(folder, record, [self.layers.root(d) for d in record.layers])


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _empty(folder: Path) -> None:
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        shutil.rmtree(entry, ignore_errors=True)
