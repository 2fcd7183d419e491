"""A registry outage, tried as a run of an image the cache already holds: Debian's
docker-registry on loopback is stopped after the image was pulled once. A reference by digest
and a tag resolved within ``TOOLQ_IMAGE_TAG_TTL_S`` start from the cache without asking; a tag
past it asks, and with the registry down runs the image the tag last named; an image the cache
never held still fails in one line."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from api.local.stack import free_port
from tests.conftest import wait_for
from tests.worker.images.builders import Images
from tests.worker.images.conftest import Host
from worker.contract.errors import ImageError
from worker.images.boxes import Boxes
from worker.images.fetch import Tools


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True
    except OSError:
        return False
    return True


@dataclass
class LoopbackRegistry:
    """A registry on loopback that a test can stop, as an outage does."""

    host: str
    process: subprocess.Popen[bytes]

    def push(self, image: str, name: str) -> str:
        """``image`` pushed as ``name`` (``repo:tag``); the reference it is pulled by."""
        reference = f"{self.host}/{name}"
        subprocess.run(
            ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", image,
             f"docker://{reference}"],
            check=True,
            capture_output=True,
            timeout=120,
        )  # fmt: skip
        return reference

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait(timeout=10)
        assert not _answers(f"http://{self.host}/v2/")


@pytest.fixture
def registry(images_root: Path) -> Iterator[LoopbackRegistry]:
    binary = shutil.which("docker-registry")
    if binary is None:
        pytest.skip("docker-registry is not installed (Debian's docker-registry package)")
    folder = Path(images_root) / f"registry-{free_port()}"
    folder.mkdir()
    host = f"127.0.0.1:{free_port()}"
    (folder / "config.yml").write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "error"},
                "storage": {
                    "filesystem": {"rootdirectory": str(folder / "data")},
                    "delete": {"enabled": True},
                },
                "http": {"addr": host},
            }
        )
    )
    process = subprocess.Popen(
        [binary, "serve", str(folder / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    made = LoopbackRegistry(host, process)
    try:
        wait_for(lambda: _answers(f"http://{host}/v2/"), timeout=20, what="the registry")
        yield made
    finally:
        made.stop()


def reaching(host: Host, registry: LoopbackRegistry, tag_ttl_s: float) -> None:
    """The host's worker, reaching ``registry`` over plain HTTP, believing tags ``tag_ttl_s``."""
    tools = Tools(insecure_registries=(registry.host,))
    host.boxes = Boxes(replace(host.boxes.settings, tools=tools, tag_ttl_s=tag_ttl_s))


def start_and_end(host: Host, run_id: str, image: str) -> tuple[str, bool]:
    """A run's box started from ``image`` and ended: the digest it ran, and whether it pulled."""
    _, record = host.start(run_id, image)
    host.boxes.end(run_id, time.monotonic() + 30)
    return record.digest, record.pulled  # type: ignore[attr-defined]


def test_a_digest_and_a_fresh_tag_start_from_the_cache_while_the_registry_is_down(
    host: Host, images: Images, registry: LoopbackRegistry
) -> None:
    reaching(host, registry, tag_ttl_s=3600)
    tag = registry.push(images.alpha, "toolq/alpha:v1")
    digest, pulled = start_and_end(host, "first", tag)
    assert pulled
    registry.stop()
    by_digest = f"{registry.host}/toolq/alpha@{digest}"
    assert start_and_end(host, "by-digest", by_digest) == (digest, False)
    assert start_and_end(host, "by-tag", tag) == (digest, False)
    # Another worker process of the host (a cache of the same folder) knows the tag too.
    reaching(host, registry, tag_ttl_s=3600)
    assert start_and_end(host, "other-process", tag) == (digest, False)


def test_a_stale_tag_runs_the_image_it_last_named_when_the_registry_is_down(
    host: Host, images: Images, registry: LoopbackRegistry
) -> None:
    reaching(host, registry, tag_ttl_s=0)
    tag = registry.push(images.alpha, "toolq/alpha:v1")
    digest, _ = start_and_end(host, "first", tag)
    registry.stop()
    assert start_and_end(host, "stale", tag) == (digest, False)
    # A tag the cache never resolved still needs the registry: one line saying it is down.
    with pytest.raises(ImageError) as raised:
        host.start("never", f"{registry.host}/toolq/alpha:v2")
    assert "cannot be reached" in str(raised.value) and "\n" not in str(raised.value)


def test_a_tag_is_asked_again_once_its_time_is_past_and_not_before(
    host: Host, images: Images, registry: LoopbackRegistry
) -> None:
    reaching(host, registry, tag_ttl_s=3600)
    tag = registry.push(images.alpha, "toolq/app:latest")
    first, _ = start_and_end(host, "first", tag)
    moved = registry.push(images.beta, "toolq/app:latest")
    assert moved == tag
    # Within its time the tag is what it resolved to, as a local docker tag is until pulled.
    assert start_and_end(host, "within", tag)[0] == first
    reaching(host, registry, tag_ttl_s=0)
    second, pulled = start_and_end(host, "past", tag)
    assert second != first and pulled


def test_a_registry_that_answers_unknown_tag_is_believed_over_the_cache(
    host: Host, images: Images, registry: LoopbackRegistry
) -> None:
    reaching(host, registry, tag_ttl_s=0)
    tag = registry.push(images.alpha, "toolq/alpha:v1")
    start_and_end(host, "first", tag)
    subprocess.run(
        ["skopeo", "delete", "--tls-verify=false", f"docker://{tag}"],
        check=True,
        capture_output=True,
        timeout=60,
    )
    with pytest.raises(ImageError) as raised:
        host.start("gone", tag)
    assert "cannot be reached" not in str(raised.value)
