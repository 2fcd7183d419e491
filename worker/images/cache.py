"""The image cache of a sandbox worker (``TOOLQ_IMAGE_CACHE``): each image unpacked once per
host, by digest, shared by the worker's processes and bounded by ``TOOLQ_IMAGE_CACHE_BYTES``.

```
<cache>/images/<hex>/rootfs      the image's files, never written after unpacking
<cache>/images/<hex>/image.json  what toolq keeps of it (``ImageRecord``)
<cache>/images/<hex>/used        touched when a container starts from it: the LRU clock
<cache>/pulls/<hex>.lock         held while one process pulls that digest; the others wait
<cache>/tags/<hex>.json          what a tag last resolved to, and when (``worker.images.tags``)
<cache>/lock                     held while images are counted, claimed or evicted
```

An image is pulled into a folder of its own under ``pulls/`` and renamed into place whole, so a
process killed mid-pull leaves no half image (only a folder the next sweep removes). Before its
layers are unpacked, what they unpack to is counted (``worker.images.layers``), stopping at the
bound less the images containers use: an image past it is refused with nothing unpacked, saying
which limit. When a new image does not fit, the least recently used images that no container
uses are removed first; when even that is not enough the pull fails, saying the cache is full of
images in use.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

from pydantic import BaseModel

from worker.contract.image_errors import ImageError
from worker.contract.image_reference import ImageReference
from worker.images.fetch import Tools, image_config
from worker.images.layers import TooLarge, readable_size, unpacked_bytes
from worker.images.locks import lock_by
from worker.images.rootfs import has_shell
from worker.images.tags import TagResolver

#: How long a tag's digest is believed without asking its registry (``TOOLQ_IMAGE_TAG_TTL_S``).
DEFAULT_TAG_TTL_S = 600.0
#: Between two looks at a lock another process holds.
_LOCK_POLL_S = 0.05


class ImageRecord(BaseModel):
    """One unpacked image: what a container of it needs from its configuration."""

    digest: str
    #: The reference it was first pulled by.
    reference: str
    size_bytes: int
    env: list[str]
    user: str
    workdir: str


class CachedImage:
    """An image in the cache: its record and its root file system."""

    def __init__(self, folder: Path, record: ImageRecord) -> None:
        self.folder = folder
        self.record = record

    @property
    def rootfs(self) -> Path:
        return self.folder / "rootfs"


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
        self.tags = TagResolver(root, tag_ttl_s, tools, self._present)

    def resolve(self, ref: ImageReference, deadline: float) -> str:
        """The digest ``ref`` names: from the cache where it can tell (``worker.images.tags``),
        else from the registry."""
        return self.tags.resolve(ref, deadline)

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
                if image is None:
                    continue  # evicted between the pull and the claim: pull again
                (image.folder / "used").touch()
                claim(image)
                return image, pulled
        raise ImageError(ref.text, "it was evicted from the image cache as soon as it was pulled")

    @contextlib.contextmanager
    def locked(self, deadline: float, ref: ImageReference | None = None) -> Iterator[None]:
        """The cache's lock: counting, claiming and evicting happen under it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with _flock(self.root / "lock", deadline, ref, "the image cache is busy"):
            yield

    def images(self) -> list[CachedImage]:
        folder = self.root / "images"
        found = []
        for entry in sorted(folder.iterdir()) if folder.is_dir() else []:
            image = self._load_folder(entry)
            if image is not None:
                found.append(image)
        return found

    def remove_leftover_pulls(self) -> int:
        """Remove pulls that a process killed mid-pull left (their lock is free)."""
        pulls = self.root / "pulls"
        removed = 0
        for entry in list(pulls.iterdir()) if pulls.is_dir() else []:
            if not entry.is_dir():
                continue
            lock = pulls / f"{entry.name.split('.', 1)[0]}.lock"
            try:
                with _flock(lock, time.monotonic(), None, ""):
                    shutil.rmtree(entry, ignore_errors=True)
                    removed += 1
            except ImageError:
                continue  # a pull of that digest is under way
        _empty(self.root / "trash")
        return removed

    def _pull(self, ref: ImageReference, digest: str, deadline: float) -> bool:
        hex_digest = digest.partition(":")[2]
        pulls = self.root / "pulls"
        pulls.mkdir(mode=0o700, parents=True, exist_ok=True)
        (self.root / "images").mkdir(mode=0o700, exist_ok=True)
        with _flock(pulls / f"{hex_digest}.lock", deadline, ref, "another pull of it is slow"):
            if self._present(digest):
                return False  # another process pulled it while this one waited
            work = pulls / f"{hex_digest}.{uuid.uuid4().hex[:8]}"
            try:
                work.mkdir()
                self._unpack(ref, digest, work, deadline)
            finally:
                shutil.rmtree(work, ignore_errors=True)
        return True

    def _unpack(self, ref: ImageReference, digest: str, work: Path, deadline: float) -> None:
        layout, bundle = work / "layout", work / "bundle"
        self.tools.copy(ref, digest, layout, deadline)
        self._check_fits(ref, layout, deadline)
        self.tools.unpack(ref, layout, bundle, deadline)
        try:
            config = image_config(layout)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ImageError(ref.text, f"its configuration cannot be read: {exc}") from None
        rootfs = bundle / "rootfs"
        if not has_shell(rootfs):
            raise ImageError(
                ref.text,
                "it has no /bin/sh, which every command of a run goes through "
                "(use an image with a shell)",
            )
        record = ImageRecord(
            digest=digest,
            reference=ref.text,
            size_bytes=disk_usage(rootfs),
            env=[str(e) for e in config.get("Env") or []],
            user=str(config.get("User") or ""),
            workdir=str(config.get("WorkingDir") or ""),
        )
        image = work / "image"
        image.mkdir()
        rootfs.rename(image / "rootfs")
        (image / "image.json").write_text(record.model_dump_json())
        (image / "used").touch()
        with self.locked(deadline, ref):
            self._make_room(ref, record.size_bytes)
            target = self._folder(digest)
            target.parent.mkdir(parents=True, exist_ok=True)
            image.rename(target)

    def _check_fits(self, ref: ImageReference, layout: Path, deadline: float) -> None:
        """Count what the copied image unpacks to, stopping at the room the cache can make for
        it (its bound less the images containers use); ``ImageError`` naming the limit when it
        is past it, before anything is unpacked."""
        with self.locked(deadline, ref):
            used = self._in_use()
            held = sum(i.record.size_bytes for i in self.images() if i.record.digest in used)
        room = max(self.bound - held, 0)
        try:
            unpacked_bytes(ref.text, layout, room)
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

    def _make_room(self, ref: ImageReference, size: int) -> None:
        """Evict least recently used images no container uses until ``size`` more bytes fit;
        ``ImageError`` when they cannot."""
        images = self.images()
        used = self._in_use()
        total = sum(i.record.size_bytes for i in images)
        if total + size <= self.bound:
            return
        idle = sorted(
            (i for i in images if i.record.digest not in used),
            key=lambda i: _mtime(i.folder / "used"),
        )
        for image in idle:
            self._evict(image)
            total -= image.record.size_bytes
            if total + size <= self.bound:
                return
        raise ImageError(
            ref.text,
            f"the image cache is full of images in use: it needs {size:,} bytes and "
            f"{total:,} of its {self.bound:,} bytes (TOOLQ_IMAGE_CACHE_BYTES) hold images "
            "that running containers use",
        )

    def _evict(self, image: CachedImage) -> None:
        trash = self.root / "trash"
        trash.mkdir(exist_ok=True)
        aside = trash / f"{image.folder.name}.{uuid.uuid4().hex[:8]}"
        image.folder.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)

    def _folder(self, digest: str) -> Path:
        return self.root / "images" / digest.partition(":")[2]

    def _present(self, digest: str) -> bool:
        return (self._folder(digest) / "image.json").is_file()

    def _load(self, digest: str) -> CachedImage | None:
        return self._load_folder(self._folder(digest))

    @staticmethod
    def _load_folder(folder: Path) -> CachedImage | None:
        try:
            record = ImageRecord.model_validate_json((folder / "image.json").read_bytes())
        except (OSError, ValueError):
            return None
        return CachedImage(folder, record)


def disk_usage(root: Path) -> int:
    """Bytes of disk ``root`` takes (blocks, each hard link once), links not followed."""
    seen: set[tuple[int, int]] = set()
    total = 0
    stack = [root]
    while stack:
        folder = stack.pop()
        with contextlib.suppress(OSError), os.scandir(folder) as entries:
            for entry in entries:
                info = entry.stat(follow_symlinks=False)
                key = (info.st_dev, info.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += info.st_blocks * 512
                if entry.is_dir(follow_symlinks=False):
                    stack.append(Path(entry.path))
    return total


@contextlib.contextmanager
def _flock(path: Path, deadline: float, ref: ImageReference | None, busy: str) -> Iterator[None]:
    """An exclusive lock on ``path``, waited for until ``deadline``; ``ImageError`` (saying
    ``busy``) when it does not come."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        if not lock_by(fd, deadline, _LOCK_POLL_S):
            raise ImageError(ref.text if ref else str(path), busy)
        yield
    finally:
        os.close(fd)


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0


def _empty(folder: Path) -> None:
    for entry in list(folder.iterdir()) if folder.is_dir() else []:
        shutil.rmtree(entry, ignore_errors=True)
