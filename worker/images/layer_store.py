"""The image cache's layers, each unpacked once per host and shared by every image that has it.

```
<cache>/layers/<hex>/root        the layer's files in overlayfs's form, never written after
<cache>/layers/<hex>/blob        the layer as its image's registry gave it (compressed)
<cache>/layers/<hex>/layer.json  its diff id, its blob's digest and the disk both take
```

``<hex>`` is the layer's diff id (the sha256 of its uncompressed tar), which its unpacking
checked. A layer is unpacked into a folder of the pull's own and renamed into place whole; a
layer that another pull placed first is kept and the copy dropped. Layers are removed when no
image of the cache has them any more (``ImageCache``, under the cache's lock).

The blobs are kept so that the next image on the same base is not downloaded whole again:
before a pull, they are linked into its layout, where skopeo finds them and skips them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import uuid
from pathlib import Path

from pydantic import BaseModel


class LayerRecord(BaseModel):
    diff_id: str
    size_bytes: int
    #: The digest of ``blob``: the layer as its image's manifest names it.
    blob: str = ""


class LayerStore:
    """The layers below ``<cache>/layers``; ``trash`` is where removed ones go first (a rename,
    so a half removed layer is never seen as one)."""

    def __init__(self, cache_root: Path) -> None:
        self.folder = cache_root / "layers"
        self.trash = cache_root / "trash"

    def root(self, diff_id: str) -> Path:
        """The layer's files (a lower layer of the containers of its images)."""
        return self._folder(diff_id) / "root"

    def record(self, diff_id: str) -> LayerRecord | None:
        try:
            return LayerRecord.model_validate_json(
                (self._folder(diff_id) / "layer.json").read_bytes()
            )
        except (OSError, ValueError):
            return None

    def present(self, diff_id: str) -> bool:
        return self.record(diff_id) is not None

    def sizes(self) -> dict[str, int]:
        """Every layer present: its diff id and its disk."""
        found = {}
        for entry in sorted(self.folder.iterdir()) if self.folder.is_dir() else []:
            record = self.record(f"sha256:{entry.name}")
            if record is not None:
                found[record.diff_id] = record.size_bytes
        return found

    def place(self, diff_id: str, unpacked: Path, size: int, blob: str) -> None:
        """The layer unpacked at ``unpacked`` (a folder whose ``root`` holds its files and
        whose ``blob`` is the blob of digest ``blob``) into place, unless one is there
        already."""
        if self.present(diff_id):
            return
        (unpacked / "layer.json").write_text(
            LayerRecord(diff_id=diff_id, size_bytes=size, blob=blob).model_dump_json()
        )
        target = self._folder(diff_id)
        self.folder.mkdir(mode=0o700, exist_ok=True)
        if target.exists():
            self.discard(target)  # a layer folder a killed pull left without its record
        unpacked.rename(target)

    def link_blobs(self, layout: Path) -> int:
        """Every kept blob linked into the OCI layout ``layout`` (made if missing), where a
        copy into it finds them; how many."""
        blobs = layout / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        marker = layout / "oci-layout"
        if not marker.exists():
            marker.write_text('{"imageLayoutVersion":"1.0.0"}')
        linked = 0
        for entry in sorted(self.folder.iterdir()) if self.folder.is_dir() else []:
            record = self.record(f"sha256:{entry.name}")
            algorithm, _, value = record.blob.partition(":") if record else ("", "", "")
            if not algorithm.isalnum() or not value.isalnum():
                continue
            (blobs / algorithm).mkdir(exist_ok=True)
            # A layer removed meanwhile, or a blob two layers share: either is skipped.
            with contextlib.suppress(OSError):
                os.link(entry / "blob", blobs / algorithm / value)
                linked += 1
        return linked

    def remove(self, diff_id: str) -> None:
        target = self._folder(diff_id)
        if target.exists():
            self.discard(target)

    def discard(self, target: Path) -> None:
        """Remove the folder ``target`` of the cache (a layer's, or an image's): renamed into
        ``trash`` first, so that it is whole or gone."""
        self.trash.mkdir(exist_ok=True)
        aside = self.trash / f"{target.name}.{uuid.uuid4().hex[:8]}"
        target.rename(aside)
        shutil.rmtree(aside, ignore_errors=True)

    def _folder(self, diff_id: str) -> Path:
        return self.folder / diff_id.partition(":")[2]


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
