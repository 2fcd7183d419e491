"""``TOOLQ_IMAGE_SOURCES`` as an operator sets it, on real sandbox workers: a batch whose items
name the allowed registry (Debian's docker-registry on loopback) and the allowed folder runs
them; items that point the workers at another listener of their loopback, or at a file of their
host, fail in one line with nothing connected to."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from api.scripted.server import ScriptedServer
from tests.conftest import WorkerFleet
from tests.e2e.test_batch_cli import run_batch, write_items
from tests.e2e.test_batch_images import env_for, item, model  # noqa: F401 (model: a fixture)
from tests.e2e.test_image_registry import Registry, built, registry  # noqa: F401 (fixtures)
from tests.results_file import finished_records
from tests.worker.images.builders import Images, image_fleet
from tests.worker.images.test_sources import listener, refusal


@pytest.fixture(scope="module")
def allowing_fleet(
    built: tuple[Path, Images],  # noqa: F811
    registry: Registry,  # noqa: F811
) -> Iterator[WorkerFleet]:
    root, images = built
    with image_fleet(
        root,
        root,
        insecure_registries=[registry.host],
        registry_auth_file=registry.auth_file,
        image_sources=[registry.host, f"oci:{images.layout}"],
    ) as workers:
        yield workers


def test_named_sources_run_and_others_are_refused_unreached(
    allowing_fleet: WorkerFleet,
    built: tuple[Path, Images],  # noqa: F811
    registry: Registry,  # noqa: F811
    model: ScriptedServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    _, images = built

    with listener() as probe:
        refused = {
            "probe": f"127.0.0.1:{probe.server_address[1]}/probe:1",
            "host-file": "docker-archive:/etc/passwd",
        }
        source = write_items(
            tmp_path / "in.jsonl",
            [
                item("registry", "os_release", image=registry.image),
                item("folder", "os_release", image=images.alpha),
                *(item(item_id, "os_release", image=image) for item_id, image in refused.items()),
            ],
        )
        output = tmp_path / "out.jsonl"
        done = run_batch(source, output, env_for(allowing_fleet, model), 2)
        assert probe.connections == []
    assert "Finished: 2 ok, 2 error" in done.stderr, done.stderr
    records = {r["id"]: r for r in finished_records(output)}
    for item_id in ("registry", "folder"):
        assert records[item_id]["status"] == "ok" and "toolq-alpha" in records[item_id]["answer"]
    for item_id, image in refused.items():
        assert records[item_id]["error"] == refusal(image)
