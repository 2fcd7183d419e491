"""What an image's layers unpack to, counted before anything is unpacked.

Each layer of the copied OCI layout is read as a stream: decompressed in memory, its tar
headers read one by one, the disk each entry will take added up. The count stops as soon as it
passes the bound it was given, so a layer that inflates to gigabytes (a gzip bomb) costs at most
that bound of decompression and nothing on disk. The sum is of every layer, whiteouts and files
that later layers replace included: never less than what unpacking writes.
"""

from __future__ import annotations

import gzip
import io
import tarfile
import zlib
from collections.abc import Container, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import BinaryIO, cast

from worker.contract.errors import ImageError
from worker.exceptions import TooLarge
from worker.images.fetch import image_layers

#: What a file's content takes on disk: whole blocks.
_BLOCK = 4096
#: What any other entry takes at least: its tar header (and its inode).
_ENTRY = 512
_READ_CHUNK = 1 << 16


def unpacked_bytes(image: str, layout: Path, bound: int, held: Container[str] = frozenset()) -> int:
    """The bytes of disk the image tagged in ``layout`` takes unpacked (its layers' files, each
    rounded up to whole blocks), but for its layers whose diff id is in ``held`` (the cache
    has them unpacked already). ``TooLarge`` as soon as the count passes ``bound``;
    ``ImageError`` when a layer cannot be read as a tar archive."""
    try:
        blobs = [(layer.media_type, layer.blob) for layer in image_layers(layout)
                 if layer.diff_id not in held]  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ImageError(image, f"its manifest cannot be read: {exc}") from None
    total = 0
    for number, (media_type, blob) in enumerate(blobs, 1):
        try:
            with decompressed(image, media_type, blob) as stream:
                total = _count_tar(stream, total, bound)
        except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
            raise ImageError(
                image, f"its layer {number} is not a tar archive it can read (corrupt?): {exc}"
            ) from None
    return total


def _count_tar(stream: io.BufferedIOBase, total: int, bound: int) -> int:
    """``total`` plus what the tar archive ``stream`` unpacks to; ``TooLarge`` past ``bound``,
    checked at each header, before the entry's content is read."""
    with tarfile.open(fileobj=stream, mode="r|") as archive:
        while (member := archive.next()) is not None:
            # Stream mode keeps every header it read: a layer of millions of entries would
            # keep them all in memory.
            vars(archive)["members"].clear()
            total += _disk_of(member)
            if total > bound:
                raise TooLarge(total)
    return total


def _disk_of(member: tarfile.TarInfo) -> int:
    if member.isreg():
        return max(_ENTRY, -(-member.size // _BLOCK) * _BLOCK)
    if member.isdir():
        return _BLOCK
    return _ENTRY


@contextmanager
def decompressed(image: str, media_type: str, blob: Path) -> Iterator[io.BufferedIOBase]:
    """``blob``'s tar stream, decompressed as its media type says."""
    with blob.open("rb") as raw:
        if media_type.endswith(("+gzip", ".tar.gzip")):
            with gzip.GzipFile(fileobj=raw, mode="rb") as inflated:
                yield inflated
        elif media_type.endswith("+zstd"):
            yield _zstd_reader(image, raw)
        elif media_type.endswith((".tar", "layer.v1.tar")):
            yield raw
        else:
            raise ImageError(image, f"it has a layer of a kind toolq does not unpack: {media_type}")


def _zstd_reader(image: str, raw: BinaryIO) -> io.BufferedIOBase:
    try:
        import zstandard
    except ImportError:
        raise ImageError(
            image,
            "it has zstd-compressed layers, which this sandbox worker cannot count before "
            "unpacking (install the zstandard package)",
        ) from None
    # Not an io class, but it reads as one: all a tar stream asks of it.
    return cast(
        io.BufferedIOBase,
        zstandard.ZstdDecompressor().stream_reader(raw, read_size=_READ_CHUNK),
    )


def readable_size(count: int) -> str:
    """``count`` bytes as an operator writes a size: ``1 GiB``, ``1.5 MiB``, ``812 bytes``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f}".removesuffix(".0") + f" {unit}"
    return f"{count:,} bytes"
