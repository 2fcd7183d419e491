"""Layers shared by digest: an image on a cached base unpacks only its own new layer, both images
run, and apart; a run's writes to / reach neither the shared layer nor any other run; an ended
run leaves nothing mounted; an evicted image takes only the layers no other image has."""

from __future__ import annotations

import hashlib
import os
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.worker.images.builders import build_image, derive_image
from tests.worker.images.conftest import Host
from tests.worker.images.test_boxes import run
from worker.contract.image_reference import ImageReference
from worker.images.boxes import BoxRecord
from worker.images.fetch import LayerBlob, Tools
from worker.images.layer_store import disk_usage

#: Run ids of this module's own: a box's control group is named after its run, host-wide.
TAG = uuid.uuid4().hex[:6]
#: What the derived image adds to its base: a kilobyte.
ADDED = b"x" * 1024


@dataclass(frozen=True)
class LayerRecorder(Tools):
    """The real tools, noting each layer they unpacked: (image, its number, its diff id)."""

    unpacked: list[tuple[str, int, str]] = field(default_factory=list)
    #: The blobs each copy found in its layout before it began (what it need not fetch).
    found: list[set[str]] = field(default_factory=list)

    def copy(self, ref: ImageReference, digest: str, layout: Path, deadline: float) -> None:
        blobs = layout / "blobs" / "sha256"
        there = list(blobs.iterdir()) if blobs.is_dir() else []
        self.found.append({f"sha256:{p.name}" for p in there})
        super().copy(ref, digest, layout, deadline)

    def unpack_layer(
        self, ref: ImageReference, number: int, layer: LayerBlob, target: Path, deadline: float
    ) -> None:
        self.unpacked.append((ref.text, number, layer.diff_id))
        super().unpack_layer(ref, number, layer, target, deadline)


@dataclass(frozen=True)
class Pair:
    base: str
    derived: str


@pytest.fixture
def pair(host: Host) -> Pair:
    """A base image of every busybox applet, and one more image that adds 1 KB to it."""
    layout = host.root / "pair-layout"
    base = build_image(layout, "base", name="toolq-base", applets=("sh", "cat", "echo", "ls"))
    return Pair(base, derive_image(layout, "base", "derived", {"/etc/derived": ADDED}))


def layers_folder(host: Host) -> Path:
    return host.boxes.settings.cache_root / "layers"


def tree_digest(root: Path) -> str:
    """Every name, owner, mode and content below ``root``: what a change of any would show."""
    digest = hashlib.sha256()
    for folder, dirs, files in sorted(os.walk(root)):
        dirs.sort()
        for name in sorted([*dirs, *files]):
            path = Path(folder) / name
            info = os.lstat(path)
            digest.update(f"{path.relative_to(root)} {info.st_mode} {info.st_uid}".encode())
            if path.is_file() and not path.is_symlink():
                digest.update(path.read_bytes())
    return digest.hexdigest()


def test_an_image_on_a_cached_base_unpacks_only_its_new_layer(host: Host, pair: Pair) -> None:
    tools = LayerRecorder()
    host.boxes.cache.tools = tools
    base_ws, base = host.start(f"run-base-{TAG}", pair.base)
    assert isinstance(base, BoxRecord) and base.pulled
    assert [(image, number) for image, number, _ in tools.unpacked] == [(pair.base, 1)]
    base_bytes = disk_usage(layers_folder(host))
    tools.unpacked.clear()

    derived_ws, derived = host.start(f"run-derived-{TAG}", pair.derived)
    assert isinstance(derived, BoxRecord) and derived.pulled
    # Only the layer the cache had not: the second of the derived image.
    assert [(image, number) for image, number, _ in tools.unpacked] == [(pair.derived, 2)]
    written = disk_usage(layers_folder(host)) - base_bytes
    assert 0 < written * 20 < base_bytes, "the second image wrote a base's worth of files"
    images = {i.record.digest: i.record for i in host.boxes.cache.images()}
    assert images[derived.digest].layers[:1] == images[base.digest].layers
    assert len({*images[base.digest].layers, *images[derived.digest].layers}) == 2
    assert len(list(layers_folder(host).iterdir())) == 2
    # The base layer's blob was in the second copy's layout already: not fetched again.
    base_blob = host.boxes.cache.layers.record(images[base.digest].layers[0])
    assert base_blob is not None and tools.found[-1] == {base_blob.blob}

    # Both run, each with its own files.
    assert run(host, derived_ws, derived, "cat /etc/derived").stdout == ADDED.decode()
    assert "toolq-base" in run(host, derived_ws, derived, "cat /etc/os-release").stdout
    assert "toolq-base" in run(host, base_ws, base, "cat /etc/os-release").stdout
    missing = run(host, base_ws, base, "cat /etc/derived")
    assert missing.exit_code != 0 and "No such file" in missing.stderr


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_a_run_writing_to_its_root_changes_no_shared_layer_nor_another_run(
    host: Host, pair: Pair
) -> None:
    attacker_ws, attacker = host.start(f"run-attacker-{TAG}", pair.base)
    (base_layer,) = layers_folder(host).iterdir()
    before = tree_digest(base_layer)
    # As the box's root: overwrite, remove, add and change the mode of the image's files.
    vandal = (
        "echo pwned > /etc/os-release; rm -f /bin/ls; echo new > /planted; chmod 777 /etc; "
        "mkdir -p /usr/x && echo y > /usr/x/y; cat /etc/os-release"
    )
    assert run(host, attacker_ws, attacker, vandal).stdout == "pwned\n"
    sibling_ws, sibling = host.start(f"run-sibling-{TAG}", pair.base)
    derived_ws, derived = host.start(f"run-derived-{TAG}", pair.derived)
    look = "cat /etc/os-release; ls /planted /usr/x /bin/ls 2>&1; ls -ld /etc"
    for workspace, box in ((sibling_ws, sibling), (derived_ws, derived)):
        seen = run(host, workspace, box, look).stdout
        assert "toolq-base" in seen and "pwned" not in seen
        assert "/planted" in seen and "/usr/x" in seen and "No such file" in seen
        assert "\n/bin/ls\n" in seen, "the attacker's removal reached another run"
        assert "drwxrwxrwx" not in seen
    assert tree_digest(base_layer) == before
    host.boxes.end(f"run-attacker-{TAG}", time.monotonic() + 30)
    again_ws, again = host.start(f"run-again-{TAG}", pair.base)
    assert "pwned" not in run(host, again_ws, again, "cat /etc/os-release").stdout
    assert tree_digest(base_layer) == before


def test_ended_runs_leave_nothing_mounted_below_the_cache(host: Host, pair: Pair) -> None:
    for n, image in enumerate((pair.base, pair.derived, pair.base)):
        workspace, box = host.start(f"run-{n}-{TAG}", image)
        assert run(host, workspace, box, "echo up").stdout == "up\n"
    cache = str(host.boxes.settings.cache_root)
    assert mounts_below(cache), "each box's root is a mount while it runs"
    for n in range(3):
        host.boxes.end(f"run-{n}-{TAG}", time.monotonic() + 30)
    assert mounts_below(cache) == []


def test_an_evicted_image_takes_only_the_layers_no_other_image_has(host: Host, pair: Pair) -> None:
    host.start(f"run-base-{TAG}", pair.base)
    host.start(f"run-derived-{TAG}", pair.derived)
    host.boxes.end(f"run-derived-{TAG}", time.monotonic() + 30)
    images = {i.record.reference: i.record for i in host.boxes.cache.images()}
    base_layer, own_layer = images[pair.derived].layers
    # Room for what the cache holds and little more: the next image, on the same base, evicts
    # the idle one.
    host.boxes.cache.bound = sum(host.boxes.cache.layers.sizes().values()) + 1
    other = derive_image(host.root / "pair-layout", "base", "other", {"/etc/other": ADDED})
    host.start(f"run-other-{TAG}", other)
    kept = {i.record.reference for i in host.boxes.cache.images()}
    assert kept == {pair.base, other}
    present = {f"sha256:{p.name}" for p in layers_folder(host).iterdir()}
    assert base_layer in present and own_layer not in present


def mounts_below(folder: str) -> list[str]:
    with open("/proc/self/mountinfo") as info:
        return [p for line in info if (p := line.split()[4]).startswith(folder + "/")]
