"""Two fleets on one host may each have a run of the same id, each with an image: their boxes
are two, with control groups of their own, and ending one (or killing what a call left in it)
touches nothing of the other's."""

from __future__ import annotations

import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.images.builders import Images
from tests.worker.images.conftest import Host
from tests.worker.images.test_boxes import run
from worker.images.boxes import BoxRecord, box_name
from worker.plumbing.proc_stat import process_alive

RUN_ID = "sample-1"


@pytest.fixture
def other_fleet(images_root: Path, host: Host) -> Iterator[Host]:
    """A second worker's cache and workspaces on the same host, as another fleet's."""
    root = Path(tempfile.mkdtemp(prefix="other-", dir=images_root))
    root.chmod(0o711)
    other = Host(root, host.boxes.settings.runtime)
    yield other
    other.close()


def test_the_same_run_id_in_two_fleets_is_two_boxes_that_never_touch(
    host: Host, other_fleet: Host, images: Images
) -> None:
    ours_ws, ours = host.start(RUN_ID, images.alpha)
    theirs_ws, theirs = other_fleet.start(RUN_ID, images.alpha)
    assert isinstance(ours, BoxRecord) and isinstance(theirs, BoxRecord)
    assert ours.name != theirs.name and ours.cgroups_path != theirs.cgroups_path

    # Their call leaves a process behind, killed at the call's end; then their box ends.
    left = run(other_fleet, theirs_ws, theirs, "sleep 300 & echo theirs")
    assert left.stdout == "theirs\n" and left.usage.killed_processes == 1
    other_fleet.boxes.end(RUN_ID, time.monotonic() + 30)

    assert process_alive(ours.init_pid)
    still = run(host, ours_ws, ours, "echo still here")
    assert still.stdout == "still here\n", still.stderr


def test_a_box_name_is_of_its_fleet_and_cache_too(tmp_path: Path) -> None:
    names = {
        box_name(RUN_ID, tmp_path / "a", "fleet-1"),
        box_name(RUN_ID, tmp_path / "a", "fleet-2"),
        box_name(RUN_ID, tmp_path / "b", "fleet-1"),
    }
    assert len(names) == 3
    assert all(name.startswith("toolq-") and len(name) == 30 for name in names)
