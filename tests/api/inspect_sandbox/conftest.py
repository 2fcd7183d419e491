"""What the Inspect sandbox tests share: a fleet of their own, named by TOOLQ_* variables as an
Inspect user names theirs, and the task and sandbox Inspect's own conformance checks take."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import pytest_asyncio
from inspect_ai.util import SandboxEnvironment

from api.inspect_sandbox import ToolqSandboxEnvironment
from tests.conftest import RedisServer, WorkerFleet, fleet_settings
from worker.contract.settings import FleetSettings

_WORKER_RIGHTS = (
    "files go in and out through the tools pool with the worker's rights, as Docker's do with a "
    "root default user: mode bits a command sets for the sandbox user do not bind them"
)
#: Inspect's conformance checks the toolq sandbox does not meet by design, each with why.
KNOWN_FAILURES = {
    "test_exec_as_user": "commands run as the fleet's sandbox user only: user= is refused",
    "test_read_file_not_allowed": _WORKER_RIGHTS,
    "test_write_text_file_without_permissions": _WORKER_RIGHTS,
    "test_write_binary_file_without_permissions": _WORKER_RIGHTS,
}
#: An Inspect task: its name, and the image its samples run in (None: none).
Task = tuple[str, str | None]


def fleet_variables(fleet: WorkerFleet) -> dict[str, str]:
    """The TOOLQ_* variables that point a caller at ``fleet``, with its deadlines."""
    shared = fleet.settings.model_dump(include=set(FleetSettings.model_fields), exclude_none=True)
    # Lists as the settings read them from the environment: comma-separated; objects as JSON.
    return {
        f"TOOLQ_{name.upper()}": ",".join(value)
        if isinstance(value, list)
        else json.dumps(value)
        if isinstance(value, dict)
        else str(value)
        for name, value in shared.items()
    }


@contextlib.contextmanager
def fleet_of_its_own(
    tmp_path_factory: pytest.TempPathFactory, **settings: object
) -> Iterator[WorkerFleet]:
    """Both pools on a Redis of their own, with workspaces in a folder whose parents the sandbox
    user may search (pytest's are private to root), as under a real workspace root: bash
    --login looks for the profile in $HOME, the workspace."""
    redis = RedisServer(tmp_path_factory.mktemp("inspect-redis"))
    redis.start()
    root = Path(tempfile.mkdtemp(prefix="toolq-inspect-"))
    os.chmod(root, 0o755)
    # Room for Inspect's 50 MiB conformance transfers on a busy machine.
    workers = WorkerFleet(fleet_settings(redis.url, root, max_timeout_ms=120_000, **settings))
    try:
        yield workers.start()
    finally:
        workers.stop()
        redis.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="package")
def inspect_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerFleet]:
    with fleet_of_its_own(tmp_path_factory) as workers:
        yield workers


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


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def toolq_task(conformance_task: Task) -> AsyncIterator[Task]:
    """The module's ``conformance_task``, begun before its tests and cleaned up after them."""
    name, image = conformance_task
    await ToolqSandboxEnvironment.task_init(name, image)
    yield conformance_task
    await ToolqSandboxEnvironment.task_cleanup(name, image, True)


@pytest_asyncio.fixture(loop_scope="module")
async def sandbox_env(
    toolq_task: Task, request: pytest.FixtureRequest
) -> AsyncIterator[SandboxEnvironment]:
    """A sample's sandbox in the module's task, for Inspect's conformance checks: those in
    KNOWN_FAILURES are expected to fail."""
    reason = KNOWN_FAILURES.get(request.node.originalname)
    if reason is not None:
        request.applymarker(pytest.mark.xfail(reason=reason, strict=True))
    name, image = toolq_task
    environments = await ToolqSandboxEnvironment.sample_init(name, image, {})
    yield environments["default"]
    await ToolqSandboxEnvironment.sample_cleanup(name, image, environments, False)
