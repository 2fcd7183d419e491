"""Images built once per session (busybox-static and umoci), an image cache of each test's own,
and run workspaces prepared as a root worker prepares them (a uid of the run's own)."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.images.builders import Images, build_test_images, images_folder, skip_reason
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.images.boxes import Boxes, BoxSettings
from worker.images.fetch import Tools
from worker.images.sweep import sweep_boxes
from worker.sandbox import SandboxConfig
from worker.tools.factory import prepare_workspace
from worker.tools.workspace import Workspace

#: A box's limits in these tests: small enough to hit.
MEMORY_MB = 64
MAX_PROCESSES = 24
#: The ids a box maps besides its user's: past the default range of run uids.
ID_BLOCK = UidRange.parse(DEFAULT_UID_RANGE).last + 1


@pytest.fixture(scope="session")
def images_root() -> Iterator[Path]:
    """A folder that others may pass through (as a box's root must reach its bundle)."""
    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    with images_folder() as root:
        yield root


@pytest.fixture(scope="session")
def images(images_root: Path) -> Images:
    return build_test_images(images_root / "layout")


def box_settings(cache: Path, runtime: str = "runc", cache_bytes: int = 1 << 30) -> BoxSettings:
    return BoxSettings(
        cache_root=cache,
        cache_bytes=cache_bytes,
        runtime=runtime,
        tools=Tools(),
        sandbox=SandboxSettings(memory_mb=MEMORY_MB, max_processes=MAX_PROCESSES, file_size_mb=16),
        id_block=ID_BLOCK,
    )


class Host:
    """A test's image cache and run workspaces, as one sandbox worker's."""

    def __init__(self, root: Path, runtime: str = "runc") -> None:
        self.root = root
        self.workspaces = root / "workspaces"
        self.workspaces.mkdir(parents=True)
        os.chmod(self.workspaces, 0o711)
        self.boxes = Boxes(box_settings(root / "cache", runtime))
        self.sandbox = SandboxConfig(
            SandboxSettings(
                memory_mb=MEMORY_MB,
                max_processes=MAX_PROCESSES,
                uid_range=str(UidRange.parse(DEFAULT_UID_RANGE)),
            ),
            workspace_root=str(self.workspaces),
        )

    def workspace(self, run_id: str) -> Workspace:
        return prepare_workspace(self.workspaces / run_id, self.sandbox)

    def start(self, run_id: str, image: str, **options: object) -> tuple[Workspace, object]:
        workspace = self.workspace(run_id)
        assert workspace.owner is not None
        record = self.boxes.start(
            run_id,
            workspace.root,
            workspace.owner,
            image,
            time.monotonic() + 60,
            **options,  # type: ignore[arg-type]
        )
        return workspace, record

    def close(self) -> None:
        for record in self.boxes.records():
            self.boxes.end(record.run_id, time.monotonic() + 30)
        sweep_boxes(self.boxes)


@pytest.fixture(params=["runc"])
def host(images_root: Path, request: pytest.FixtureRequest) -> Iterator[Host]:
    runtime = str(request.param)
    if shutil.which(runtime) is None:
        pytest.skip(f"{runtime} is not installed (Debian's {runtime} package)")
    root = Path(tempfile.mkdtemp(prefix="host-", dir=images_root))
    os.chmod(root, 0o711)
    made = Host(root, runtime)
    yield made
    made.close()
    leftover = [p for p in (root / "cache" / "boxes").glob("*") if p.is_dir()]
    assert leftover == [], "a box was left behind"
