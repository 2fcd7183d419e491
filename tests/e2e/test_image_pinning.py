"""The calls of a run with an image stay with the worker that holds its container: run_bash and
the file tools see the same files, and when that worker dies the run's next command says
"environment lost" (or, where the run allows it, runs in a container started again), never on
another worker's files. The container of a worker that died is swept."""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import load_fleet
from api.exceptions import ServiceCallError
from api.runs.environment import RunEnvironment
from api.runs.workspace import RunWorkspace
from tests.conftest import WorkerFleet, wait_for
from tests.worker.images.builders import Images, built_or_skip
from tests.worker.images.builders import image_fleet as fleet_of_images
from worker.contract.keys import keys

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[Path, Images]]:
    yield from built_or_skip()


@pytest.fixture
def image_fleet(built: tuple[Path, Images], tmp_path: Path) -> Iterator[WorkerFleet]:
    root, _ = built
    with fleet_of_images(root, tmp_path) as workers:
        yield workers


@pytest.fixture
async def dispatcher(image_fleet: WorkerFleet) -> AsyncIterator[Dispatcher]:
    async with Dispatcher(image_fleet.settings) as made:
        yield made


def kill_sandbox_worker(fleet: WorkerFleet) -> None:
    """SIGKILL the sandbox worker and its pool processes, and wait until the stack has started
    it again (its supervisor does, under the same node name)."""
    pids = fleet.worker_pids("sandbox")
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    client = redis.Redis.from_url(fleet.settings.redis_url)

    def announced_again() -> bool:
        for key in client.scan_iter(keys.worker_heartbeats("sandbox")):
            info = client.get(key)
            if info and json.loads(info)["pid"] not in pids:
                return True
        return False

    try:
        wait_for(announced_again, timeout=30, what="the sandbox worker started again")
    finally:
        client.close()


def new_run(
    image_fleet: WorkerFleet, dispatcher: Dispatcher, image: str, *, recreate: bool = False
) -> tuple[RunWorkspace, RunEnvironment]:
    """A new run's workspace, and its environment in ``image`` (not started yet)."""
    run_id = f"run-{uuid.uuid4().hex[:8]}"
    fleet = load_fleet(image_fleet.settings.redis_url)
    environment = RunEnvironment(dispatcher, fleet, run_id, image, recreate=recreate)
    return RunWorkspace(dispatcher, fleet, run_id), environment


async def test_a_runs_calls_stay_with_its_container_and_a_dead_worker_loses_it(
    image_fleet: WorkerFleet, dispatcher: Dispatcher, built: tuple[Path, Images]
) -> None:
    _, images = built
    workspace, environment = new_run(image_fleet, dispatcher, images.alpha)
    started = await environment.start()
    assert started.queue == f"sandbox.{started.worker}"
    # The file tools (tools pool) and the container (sandbox pool) see the same files.
    await workspace.put_files({"from-tools.txt": "hello\n"})
    answer = await workspace.run("cat from-tools.txt; echo back > from-box.txt; echo x > /etc/mark")
    assert answer.stdout == "hello\n" and answer.exit_code == 0
    assert await workspace.read_file("from-box.txt") == b"back\n"
    box = Path(image_fleet.settings.image_cache) / "boxes"
    assert len([p for p in box.iterdir() if p.is_dir()]) == 1

    kill_sandbox_worker(image_fleet)
    with pytest.raises(ServiceCallError) as lost:
        await workspace.run("cat /etc/mark", timeout_ms=3000)
    assert lost.value.kind == "environment_lost"
    message = str(lost.value)
    assert message.startswith("Error: environment lost:") and images.alpha in message
    # The new worker swept the container its predecessor left.
    wait_for(
        lambda: [p for p in box.iterdir() if p.is_dir()] == [],
        timeout=30,
        what="the dead worker's container swept",
    )
    await environment.end()


async def test_a_run_that_allows_it_gets_its_container_again(
    image_fleet: WorkerFleet, dispatcher: Dispatcher, built: tuple[Path, Images]
) -> None:
    _, images = built
    workspace, environment = new_run(image_fleet, dispatcher, images.alpha, recreate=True)
    first = await environment.start()
    await workspace.run("echo kept > in-workspace.txt; echo gone > /etc/mark")
    kill_sandbox_worker(image_fleet)
    again = await workspace.run("cat in-workspace.txt; cat /etc/mark", timeout_ms=3000)
    # A new container: the workspace is as it was, what the old container held is not.
    assert again.stdout == "kept\n" and again.exit_code == 1
    # And the model is told so, first, where a command's notices are.
    notice = again.stderr.splitlines()[0]
    assert "started again from" in notice and images.alpha in notice
    assert "everything outside it" in notice and "is gone" in notice
    assert environment.started is not None
    assert environment.started.environment == first.environment  # the run's, named after it
    await environment.end()
    box = Path(image_fleet.settings.image_cache) / "boxes"
    wait_for(lambda: [p for p in box.iterdir() if p.is_dir()] == [], timeout=30, what="swept")
