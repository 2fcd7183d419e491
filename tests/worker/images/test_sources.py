"""``TOOLQ_IMAGE_SOURCES`` on the sandbox worker, tried as a run that wants to reach what it was
not given: a registry on the worker's loopback, paths of the worker's host, a link out of an
allowed folder. A refused source gets one line, the same whatever is there, and nothing is
connected to or opened; an allowed one still runs."""

from __future__ import annotations

import contextlib
import os
import socketserver
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest

from tests.worker.images.builders import Images
from tests.worker.images.conftest import Host
from worker.contract.errors import ImageError
from worker.contract.image_sources import ImageSources
from worker.contract.settings import WorkerSettings
from worker.images.boxes import Boxes, BoxRecord


def allow(host: Host, *entries: str) -> None:
    """The host's worker, with ``entries`` as its TOOLQ_IMAGE_SOURCES."""
    host.boxes = Boxes(replace(host.boxes.settings, sources=ImageSources.parse(entries)))


def refusal(image: str) -> str:
    cause = "not a source this fleet takes images from (TOOLQ_IMAGE_SOURCES names those)"
    return f"image {image!r}: {cause}"


class Recorder(socketserver.BaseRequestHandler):
    """Notes each connection and closes it at once (a pull then fails fast)."""

    def handle(self) -> None:
        assert isinstance(self.server, Listener)
        self.server.connections.append(self.client_address)


class Listener(socketserver.ThreadingTCPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Recorder)
        self.connections: list[object] = []


@contextlib.contextmanager
def listener() -> Iterator[Listener]:
    """A TCP listener on loopback that records whoever connects to it."""
    server = Listener()
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
        serving.join(timeout=10)


def test_a_registry_it_does_not_name_is_never_connected_to(host: Host, images: Images) -> None:
    allow(host, f"oci:{images.layout}", "ghcr.io/acme")
    with listener() as server:
        port = server.server_address[1]
        for image in (f"127.0.0.1:{port}/probe:1", f"localhost:{port}/probe@sha256:{'0' * 64}"):
            with pytest.raises(ImageError) as raised:
                host.start("run-probe", image)
            assert str(raised.value) == refusal(image)
        assert server.connections == []
        # The listener does see a pull where the registry is named: what it saw above is real.
        allow(host, f"127.0.0.1:{port}")
        with pytest.raises(ImageError):
            host.start("run-probe", f"127.0.0.1:{port}/probe:1")
        assert server.connections != []
    assert host.boxes.records() == []


def test_a_path_outside_the_named_folders_says_the_same_whatever_is_there(
    host: Host, images: Images, tmp_path: Path
) -> None:
    allow(host, f"oci:{images.layout}")
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(b"not a tar archive")
    escape = images.layout / "escape"
    os.symlink(tmp_path, escape)
    try:
        for image in (
            f"docker-archive:{corrupt}",
            f"docker-archive:{tmp_path}/missing.tar",
            f"oci:{tmp_path}/missing:alpha",
            f"oci-archive:{images.layout}",  # a folder named for oci:, not for archives
            f"oci:{images.layout}/../{tmp_path.name}:alpha",
            f"oci:{escape}:alpha",  # a link in the named folder to one outside it
        ):
            with pytest.raises(ImageError) as raised:
                host.start("run-path", image)
            assert str(raised.value) == refusal(image)
    finally:
        escape.unlink()
    assert host.boxes.records() == []
    assert not (host.root / "cache" / "pulls").exists()


def test_a_named_folder_still_runs_its_images(host: Host, images: Images) -> None:
    allow(host, f"oci:{images.layout}", "docker.io/library")
    _, record = host.start("run-alpha", images.alpha)
    assert isinstance(record, BoxRecord) and record.image == images.alpha


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ("oci:relative/path", "must name an absolute folder"),
        ("https://ghcr.io/acme", "is neither a registry"),
        ("ghcr.io/Acme Corp", "is neither a registry"),
    ],
)
def test_a_setting_it_cannot_read_is_one_line_naming_the_entry(
    monkeypatch: pytest.MonkeyPatch, value: str, problem: str
) -> None:
    monkeypatch.setenv("TOOLQ_IMAGE_SOURCES", f"ghcr.io/acme, {value}")
    with pytest.raises(ValueError) as raised:
        WorkerSettings()
    assert f"TOOLQ_IMAGE_SOURCES: {value!r} {problem}" in str(raised.value)


def test_the_setting_is_read_as_a_comma_separated_list(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLQ_IMAGE_SOURCES", " ghcr.io/acme ,oci:/srv/images/,, 127.0.0.1:5000")
    assert WorkerSettings().image_sources == ["ghcr.io/acme", "oci:/srv/images/", "127.0.0.1:5000"]
