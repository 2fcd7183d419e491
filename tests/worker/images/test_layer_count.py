"""What a layout's layers unpack to, counted from their streams: gzip, zstd and plain tar layers,
a count that stops at the bound before the rest is read, and a layer that is no tar archive."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import tarfile
from pathlib import Path

import pytest

from worker.contract.errors import ImageError
from worker.exceptions import TooLarge
from worker.images.fetch import LAYOUT_TAG
from worker.images.layers import unpacked_bytes

OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
MiB = 1 << 20


def tar_of(files: dict[str, int]) -> bytes:
    """A tar archive of a folder and a file of zeros of each size."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        folder = tarfile.TarInfo("data")
        folder.type = tarfile.DIRTYPE
        archive.addfile(folder)
        for name, size in files.items():
            entry = tarfile.TarInfo(f"data/{name}")
            entry.size = size
            archive.addfile(entry, io.BytesIO(bytes(size)))
    return buffer.getvalue()


def layout_of(root: Path, layers: list[tuple[str, bytes]]) -> Path:
    """An OCI layout whose image tagged for toolq has ``layers`` (media type, blob)."""
    blobs = root / "blobs" / "sha256"
    blobs.mkdir(parents=True)

    def blob(content: bytes) -> dict[str, object]:
        digest = hashlib.sha256(content).hexdigest()
        (blobs / digest).write_bytes(content)
        return {"digest": f"sha256:{digest}", "size": len(content)}

    # Diff ids as a configuration gives them (what counting reads; unpacking checks them).
    diff_ids = [f"sha256:{hashlib.sha256(content).hexdigest()}" for _, content in layers]
    config = json.dumps({"rootfs": {"type": "layers", "diff_ids": diff_ids}}).encode()
    manifest = {
        "schemaVersion": 2,
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", **blob(config)},
        "layers": [{"mediaType": kind, **blob(content)} for kind, content in layers],
    }
    reference = {"org.opencontainers.image.ref.name": LAYOUT_TAG}
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "annotations": reference,
                **blob(json.dumps(manifest).encode()),
            }
        ],
    }
    (root / "index.json").write_text(json.dumps(index))
    return root


def test_gzip_zstd_and_plain_layers_are_counted_in_whole_blocks(tmp_path: Path) -> None:
    zstandard = pytest.importorskip("zstandard", reason="zstd layers are counted with zstandard")
    layers = [
        (f"{OCI_LAYER}+gzip", gzip.compress(tar_of({"a": 1}))),
        (f"{OCI_LAYER}+zstd", zstandard.ZstdCompressor().compress(tar_of({"b": 5000}))),
        (OCI_LAYER, tar_of({"c": 0})),
    ]
    # Each layer: a folder (a block) and its file (1 byte: a block; 5000: two; empty: a header).
    expected = 3 * 4096 + 4096 + 2 * 4096 + 512
    assert unpacked_bytes("x", layout_of(tmp_path, layers), 1 << 30) == expected


def test_the_count_stops_at_the_header_that_passes_the_bound(tmp_path: Path) -> None:
    # A big file first, then a layer that cannot be read: the count never reaches it.
    bomb = gzip.compress(tar_of({"zeros": 64 * MiB, "after": 1}))
    assert len(bomb) < MiB
    layers = [(f"{OCI_LAYER}+gzip", bomb), (f"{OCI_LAYER}+gzip", b"not gzip")]
    with pytest.raises(TooLarge) as raised:
        unpacked_bytes("x", layout_of(tmp_path, layers), 8 * MiB)
    assert raised.value.counted == 4096 + 64 * MiB


def test_a_layer_that_is_not_a_tar_archive_is_one_line(tmp_path: Path) -> None:
    layout = layout_of(tmp_path, [(f"{OCI_LAYER}+gzip", gzip.compress(b"junk" * 1000))])
    with pytest.raises(ImageError) as raised:
        unpacked_bytes("oci:/x:1", layout, 1 << 30)
    message = str(raised.value)
    assert message.startswith("image 'oci:/x:1': its layer 1 is not a tar archive")
    assert "\n" not in message


def test_a_layer_of_an_unknown_kind_is_refused(tmp_path: Path) -> None:
    layout = layout_of(tmp_path, [("application/vnd.example.layer+lz4", b"x")])
    with pytest.raises(ImageError, match="a layer of a kind toolq does not unpack"):
        unpacked_bytes("x", layout, 1 << 30)
