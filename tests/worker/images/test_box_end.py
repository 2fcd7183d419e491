"""A run's box ended when its run is over, with the real runtimes: under runsc its sandbox is
killed and the end returns once it has exited, not once whoever adopted it reaps it (runsc
delete's own wait, over a second where that init is slow); nothing of the box is left after,
and the same run may start a box again at once."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.worker.images.builders import Images
from tests.worker.images.conftest import Host
from worker.images.boxes import BoxRecord, box_group
from worker.images.runtime import OciRuntime


@pytest.fixture
def runsc_host(images_root: Path) -> Iterator[Host]:
    if shutil.which("runsc") is None:
        pytest.skip("runsc is not installed (Debian's runsc package)")
    root = Path(tempfile.mkdtemp(prefix="host-", dir=images_root))
    os.chmod(root, 0o711)
    made = Host(root, "runsc")
    yield made
    made.close()


def exited(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return True
    return state in (b"Z", b"X")


def test_a_runsc_box_ends_without_waiting_for_its_sandbox_to_be_reaped(
    runsc_host: Host, images: Images, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, started = runsc_host.start("run-end", images.alpha)
    assert isinstance(started, BoxRecord)
    runtime = runsc_host.boxes.runtime(started.image)
    asked: list[Sequence[str]] = []
    original = OciRuntime._run

    def recorded(self: OciRuntime, arguments: Sequence[str], *rest: object) -> bytes:
        asked.append(list(arguments))
        return original(self, arguments, *rest)  # type: ignore[arg-type]

    monkeypatch.setattr(OciRuntime, "_run", recorded)
    runsc_host.boxes.end("run-end", time.monotonic() + 30)
    monkeypatch.undo()
    # The end killed the box and returned once its sandbox had exited: everything the box
    # ran was gone by then. It did not wait on runsc delete, which waits for the reaping.
    assert exited(started.init_pid)
    assert [a[0] for a in asked] == ["kill"]
    # Nothing of the box is left: runsc forgets it, its group and its folder are gone.
    wait_for(lambda: started.name not in runtime.names(), 30, "runsc to forget the box")
    group = box_group(runsc_host.boxes.settings, started)
    assert not group.members()
    assert not (runsc_host.boxes.folder / started.name).exists()


def test_the_same_run_starts_a_runsc_box_again_right_after_its_end(
    runsc_host: Host, images: Images
) -> None:
    runsc_host.start("run-again", images.alpha)
    runsc_host.boxes.end("run-again", time.monotonic() + 30)
    # Whether or not runsc has forgotten the old box yet, a new one of the name starts.
    _, again = runsc_host.start("run-again", images.alpha)
    assert isinstance(again, BoxRecord) and not exited(again.init_pid)
