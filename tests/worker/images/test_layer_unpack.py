"""A layer unpacked as an attacker may have written it: whiteouts and opaque folders become
overlayfs's, and an entry that climbs out (the path-traversal corpus), goes through a link,
whites out ``..``, hard-links outside, or makes a device node is refused naming it, nothing
written outside the layer's folder; a layer whose content is not its diff id is refused."""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import stat
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.images.builders import images_folder
from tests.worker.images.conftest import Host
from tests.worker.images.test_layer_count import OCI_LAYER, layout_of, tar_of
from worker.contract.errors import ImageError
from worker.exceptions import BadEntry
from worker.images.fetch import LAYOUT_TAG
from worker.images.mounts import image_view
from worker.images.unpack import entry_parts, unpack_layer

GZIP_LAYER = "application/vnd.oci.image.layer.v1.tar+gzip"
CORPUS = Path(__file__).parents[3] / ".." / "shared" / "corpus" / "path-traversal"

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="unpacking a layer needs root")


def entry(
    name: str, kind: bytes = tarfile.REGTYPE, content: bytes = b"", **fields: object
) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.size = len(content) if kind == tarfile.REGTYPE else 0
    info.mode = 0o755 if kind == tarfile.DIRTYPE else 0o644
    for key, value in fields.items():
        setattr(info, key, value)
    return info, content


def layer_of(*entries: tuple[tarfile.TarInfo, bytes]) -> tuple[bytes, str]:
    """A gzip layer of ``entries`` and its diff id."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as archive:
        for info, content in entries:
            archive.addfile(info, io.BytesIO(content) if info.isreg() else None)
    plain = buffer.getvalue()
    return gzip.compress(plain), f"sha256:{hashlib.sha256(plain).hexdigest()}"


@pytest.fixture
def place() -> Iterator[Path]:
    """A folder with the layer's target and, beside it, what must stay untouched."""
    with images_folder() as root:
        (root / "outside").mkdir()
        (root / "target").mkdir()
        yield root


def unpack(place: Path, *entries: tuple[tarfile.TarInfo, bytes], diff_id: str = "") -> Path:
    blob, real = layer_of(*entries)
    (place / "blob").write_bytes(blob)
    target = place / "target"
    unpack_layer(
        "img", 1, GZIP_LAYER, place / "blob", diff_id or real, target, time.monotonic() + 60
    )
    return target


def refused(place: Path, *entries: tuple[tarfile.TarInfo, bytes]) -> str:
    with pytest.raises(ImageError) as raised:
        unpack(place, *entries)
    assert os.listdir(place / "outside") == [], "an entry reached outside the layer"
    message = str(raised.value)
    assert message.startswith("image 'img': its layer 1 is refused: ") and "\n" not in message
    return message


def test_whiteouts_and_opaque_folders_hide_lower_layers_as_overlayfs_reads_them(
    place: Path,
) -> None:
    lower = unpack(
        place,
        entry("etc", tarfile.DIRTYPE),
        entry("etc/gone", content=b"old"),
        entry("etc/kept", content=b"kept"),
        entry("opt", tarfile.DIRTYPE),
        entry("opt/old", content=b"old"),
    )
    lower = lower.rename(place / "lower")
    (place / "target").mkdir()
    upper = unpack(
        place,
        entry("etc/.wh.gone"),
        entry("opt", tarfile.DIRTYPE),
        entry("opt/.wh..wh..opq"),
        entry("opt/new", content=b"new"),
    )
    info = os.lstat(upper / "etc" / "gone")
    assert stat.S_ISCHR(info.st_mode) and info.st_rdev == os.makedev(0, 0)
    assert os.getxattr(upper / "opt", "trusted.overlay.opaque") == b"y"
    with image_view([lower, upper], place / "view") as view:
        assert sorted(os.listdir(view / "etc")) == ["kept"]
        assert sorted(os.listdir(view / "opt")) == ["new"]


def test_owners_modes_and_links_are_kept_as_the_layer_gives_them(place: Path) -> None:
    target = unpack(
        place,
        entry("bin", tarfile.DIRTYPE),
        entry("bin/tool", content=b"#!/bin/sh\n", mode=0o4755, uid=1000, gid=1000),
        entry("bin/sh", tarfile.SYMTYPE, linkname="/bin/busybox"),
        entry("bin/again", tarfile.LNKTYPE, linkname="bin/tool"),
    )
    info = os.lstat(target / "bin" / "tool")
    assert (info.st_uid, info.st_gid, stat.S_IMODE(info.st_mode)) == (1000, 1000, 0o4755)
    assert os.readlink(target / "bin" / "sh") == "/bin/busybox"
    assert os.path.samefile(target / "bin" / "again", target / "bin" / "tool")


def test_a_layer_that_is_not_its_diff_id_is_refused(place: Path) -> None:
    _, other = layer_of(entry("etc/passwd", content=b"root::0:0::/:/bin/sh\n"))
    with pytest.raises(ImageError) as raised:
        unpack(place, entry("etc/passwd", content=b"evil::0:0::/:/bin/sh\n"), diff_id=other)
    assert "is not what its configuration says: its content is sha256:" in str(raised.value)
    assert str(raised.value).endswith(f"not {other}")


def corpus_lines() -> list[str]:
    lines: list[str] = []
    for name in sorted(CORPUS.glob("*.txt")):
        lines += [x for x in name.read_text(errors="replace").splitlines() if x]
    return lines


def climbs(name: str) -> bool:
    """A name with a ``..`` component: out of the folder it is unpacked in."""
    return ".." in name.split("/")


def test_every_corpus_name_is_refused_or_stays_inside_the_layer() -> None:
    lines = corpus_lines()
    if not lines:
        pytest.skip(f"the path-traversal corpus is not at {CORPUS}")
    root = Path("/layer")
    refusals = 0
    for line in lines:
        try:
            parts = entry_parts(line)
        except BadEntry:
            refusals += 1
            continue
        inside = os.path.normpath(root.joinpath(*parts))
        assert inside == str(root) or inside.startswith(f"{root}/"), line
    assert refusals == sum(climbs(line) for line in lines) > 0


def test_corpus_names_that_climb_out_are_refused_with_nothing_written(place: Path) -> None:
    climbing = [line for line in corpus_lines() if climbs(line)][:40]
    if not climbing:
        pytest.skip(f"the path-traversal corpus is not at {CORPUS}")
    for line in climbing:
        message = refused(place, entry(line, content=b"owned"))
        assert "climbs out of the layer" in message


@pytest.mark.parametrize(
    ("entries", "why"),
    [
        ([entry("../outside/x", content=b"owned")], "climbs out of the layer"),
        ([entry("/a/../../outside/x", content=b"owned")], "climbs out of the layer"),
        ([entry("etc/.wh...")], "whites out no name"),
        ([entry(".wh..")], "whites out no name"),
        ([entry("../.wh.outside")], "climbs out of the layer"),
        ([entry("dev/sda", tarfile.BLKTYPE, devmajor=8)], "device node"),
        ([entry("dev/mem", tarfile.CHRTYPE, devmajor=1, devminor=1)], "device node"),
        ([entry("etc/x", tarfile.LNKTYPE, linkname="../outside/x")], "climbs out"),
        ([entry("etc/x", tarfile.LNKTYPE, linkname="etc/absent")], "does not hold"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_a_malicious_entry_is_refused_naming_it(
    place: Path, entries: list[tuple[tarfile.TarInfo, bytes]], why: str
) -> None:
    assert why in refused(place, *entries)


def test_a_link_out_of_the_layer_is_never_followed(place: Path) -> None:
    outside = place / "outside"
    message = refused(
        place,
        entry("escape", tarfile.SYMTYPE, linkname=str(outside)),
        entry("escape/owned", content=b"owned"),
    )
    assert "goes through 'escape', which is not a folder" in message
    relative = refused(
        place,
        entry("up", tarfile.SYMTYPE, linkname="../outside"),
        entry("up/.wh.x"),
    )
    assert "goes through 'up'" in relative


def test_attributes_that_steer_overlayfs_are_not_kept(place: Path) -> None:
    target = unpack(
        place,
        entry(
            "etc",
            tarfile.DIRTYPE,
            pax_headers={
                "SCHILY.xattr.trusted.overlay.redirect": "/",
                "SCHILY.xattr.user.note": "kept",
            },
        ),
    )
    assert os.listxattr(target / "etc") == ["user.note"]


def test_an_image_with_a_malicious_layer_is_refused_and_the_cache_keeps_nothing(
    host: Host,
) -> None:
    good = tar_of({"fine": 10})
    evil, _ = layer_of(entry("../../escaped", content=b"owned"))
    layout = layout_of(host.root / "evil-layout", [(OCI_LAYER, good), (GZIP_LAYER, evil)])
    image = f"oci:{layout}:{LAYOUT_TAG}"
    with pytest.raises(ImageError) as raised:
        host.start("run-evil", image)
    assert str(raised.value) == (
        f"image {image!r}: its layer 2 is refused: '../../escaped' climbs out of the layer"
    )
    cache = host.boxes.settings.cache_root
    assert host.boxes.cache.images() == []
    assert not (cache / "layers").exists() or os.listdir(cache / "layers") == []
    assert [p for p in (cache / "pulls").iterdir() if p.is_dir()] == []
    assert not (host.root / "escaped").exists() and not (cache / "escaped").exists()
