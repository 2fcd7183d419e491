"""What the Inspect sandbox tests share: a fleet of their own, named by TOOLQ_* variables as an
Inspect user names theirs."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import RedisServer, WorkerFleet, fleet_settings
from worker.contract.settings import FleetSettings


def fleet_variables(fleet: WorkerFleet) -> dict[str, str]:
    """The TOOLQ_* variables that point a caller at ``fleet``, with its deadlines."""
    shared = fleet.settings.model_dump(include=set(FleetSettings.model_fields), exclude_none=True)
    return {f"TOOLQ_{name.upper()}": str(value) for name, value in shared.items()}


@pytest.fixture(scope="package")
def inspect_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerFleet]:
    """Both pools on a Redis of their own, with workspaces in a folder whose parents the sandbox
    user may search (pytest's are private to root), as under a real workspace root: bash
    --login looks for the profile in $HOME, the workspace."""
    redis = RedisServer(tmp_path_factory.mktemp("inspect-redis"))
    redis.start()
    root = Path(tempfile.mkdtemp(prefix="toolq-inspect-"))
    os.chmod(root, 0o755)
    # Room for Inspect's 50 MiB conformance transfers on a busy machine.
    workers = WorkerFleet(fleet_settings(redis.url, root, max_timeout_ms=120_000)).start()
    try:
        yield workers
    finally:
        workers.stop()
        redis.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="module")
def fleet_env(inspect_fleet: WorkerFleet) -> Iterator[WorkerFleet]:
    """The fleet, named by this process's environment for the module's tests."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in fleet_variables(inspect_fleet).items():
            patch.setenv(name, value)
        yield inspect_fleet


@pytest.fixture(scope="package")
def image_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[WorkerFleet, str]]:
    """A fleet of its own that runs images, and an image for it: busybox with every applet (in
    /bin and /usr/bin) and a bash that is its sh."""
    from tests.worker.images.builders import (
        BASH_SHIM,
        all_applets,
        build_image,
        images_folder,
        skip_reason,
    )

    reason = skip_reason()
    if reason is not None:
        pytest.skip(reason)
    redis = RedisServer(tmp_path_factory.mktemp("inspect-image-redis"))
    redis.start()
    with images_folder() as root:
        image = build_image(
            root / "layout",
            "full",
            name="toolq-full",
            applets=all_applets(),
            files={"/bin/bash": BASH_SHIM},
            usr_bin=True,
        )
        workspaces = root / "workspaces"
        workspaces.mkdir()
        os.chmod(workspaces, 0o755)
        settings = fleet_settings(
            redis.url, workspaces, max_timeout_ms=120_000, image_cache=root / "cache"
        )
        workers = WorkerFleet(settings).start()
        try:
            yield workers, image
        finally:
            workers.stop()
            redis.stop()


@pytest.fixture(scope="module")
def image_env(image_fleet: tuple[WorkerFleet, str]) -> Iterator[tuple[WorkerFleet, str]]:
    """The image fleet, named by this process's environment for the module's tests."""
    with pytest.MonkeyPatch.context() as patch:
        for name, value in fleet_variables(image_fleet[0]).items():
            patch.setenv(name, value)
        yield image_fleet
