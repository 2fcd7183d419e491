"""An image whose layers unpack to more than the cache may take is refused before it is unpacked:
a gzip bomb (megabytes of zeros in a few kilobytes) never reaches the disk."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.worker.images.builders import Images, build_image
from tests.worker.images.conftest import Host
from worker.contract.errors import ImageError
from worker.contract.image_reference import ImageReference
from worker.images.boxes import BoxRecord
from worker.images.fetch import LayerBlob, Tools
from worker.images.layer_store import disk_usage

#: The cache's bound in these tests, and what the bomb inflates to.
BOUND = 8 << 20
BOMB = 64 << 20


@dataclass(frozen=True)
class UnpackRecorder(Tools):
    """The real tools, noting each image whose layers they unpacked (once per layer)."""

    unpacked: list[str] = field(default_factory=list)

    def unpack_layer(
        self, ref: ImageReference, number: int, layer: LayerBlob, target: Path, deadline: float
    ) -> None:
        self.unpacked.append(ref.text)
        super().unpack_layer(ref, number, layer, target, deadline)


@pytest.fixture
def bomb(host: Host) -> str:
    layout = host.root / "bomb-layout"
    image = build_image(layout, "bomb", name="toolq-bomb", files={"/zeros": bytes(BOMB)})
    compressed = sum(p.stat().st_size for p in (layout / "blobs").rglob("*") if p.is_file())
    assert compressed < BOUND // 2, "the bomb must be small before it inflates"
    return image


def test_a_gzip_bomb_is_refused_naming_the_image_and_the_limit_with_nothing_unpacked(
    host: Host, bomb: str
) -> None:
    tools = UnpackRecorder()
    host.boxes.cache.tools = tools
    host.boxes.cache.bound = BOUND
    with pytest.raises(ImageError) as raised:
        host.start("run-bomb", bomb)
    assert str(raised.value) == (
        f"image {bomb!r}: its layers unpack to more than 8 MiB (TOOLQ_IMAGE_CACHE_BYTES)"
    )
    assert tools.unpacked == []
    cache = host.root / "cache"
    assert host.boxes.cache.images() == []
    assert [p for p in (cache / "pulls").iterdir() if p.is_dir()] == []
    assert disk_usage(cache) < BOUND // 2
    assert host.boxes.records() == []


def test_an_image_within_the_bound_still_runs(host: Host, images: Images) -> None:
    tools = UnpackRecorder()
    host.boxes.cache.tools = tools
    host.boxes.cache.bound = BOUND
    _, record = host.start("run-alpha", images.alpha)
    assert isinstance(record, BoxRecord)
    assert tools.unpacked == [images.alpha]
    assert host.boxes.cache.images()[0].record.size_bytes <= BOUND


def test_room_held_by_images_in_use_is_named_as_such(host: Host, images: Images) -> None:
    _, alpha = host.start("run-1", images.alpha)
    assert isinstance(alpha, BoxRecord)
    size = host.boxes.cache.images()[0].record.size_bytes
    host.boxes.cache.bound = size + size // 2
    tools = UnpackRecorder()
    host.boxes.cache.tools = tools
    with pytest.raises(ImageError) as raised:
        host.start("run-2", images.beta)
    message = str(raised.value)
    assert "full of images in use" in message and "TOOLQ_IMAGE_CACHE_BYTES" in message
    assert tools.unpacked == []
