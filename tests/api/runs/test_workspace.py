"""A run's workspace reached through the queue, on real workers: files in and out, commands."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator

import pytest

from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet, load_fleet
from api.exceptions import FileProblemError, ServiceCallError
from api.runs.workspace import RunWorkspace, calls_end_within_s
from tests.conftest import WorkerFleet, until

pytestmark = pytest.mark.integration


@pytest.fixture
async def workspace(fleet: WorkerFleet) -> AsyncIterator[RunWorkspace]:
    async with Dispatcher(fleet.settings) as dispatcher:
        yield RunWorkspace(
            dispatcher, load_fleet(fleet.settings.redis_url), f"ws-{uuid.uuid4().hex[:10]}"
        )


async def test_files_written_are_read_back_and_collected(
    workspace: RunWorkspace, fleet: WorkerFleet
) -> None:
    blob = bytes(range(256)) * 400  # past the 50 KB cap of the model's tools
    sizes = await workspace.put_files({"data/blob.bin": blob, "data/note.txt": "hello"})
    assert sizes == {"data/blob.bin": len(blob), "data/note.txt": 5}
    on_disk = fleet.settings.workspace_root / workspace.run_id / "data" / "note.txt"
    assert on_disk.read_text() == "hello"
    assert await workspace.read_file("data/blob.bin") == blob
    collected = await workspace.collect_files(["data/*.txt"])
    assert collected.matched == 1
    assert collected.files["data/note.txt"].content == "hello"


async def test_a_missing_file_is_a_file_problem(workspace: RunWorkspace) -> None:
    with pytest.raises(FileProblemError) as caught:
        await workspace.read_file("nope.txt")
    assert caught.value.kind == "not_found"


async def test_commands_run_in_the_sandbox_pool_with_their_input(
    workspace: RunWorkspace, fleet: WorkerFleet
) -> None:
    await workspace.put_files({"in.txt": "three\nlines\nhere\n"})
    counted = await workspace.run(["wc", "-l", "in.txt"])
    assert counted.stdout.split() == ["3", "in.txt"]
    assert counted.exit_code == 0 and not counted.timed_out
    sandbox_pids = {f"{pid}" for pid in fleet.worker_pids("sandbox")}
    assert counted.worker is not None and counted.worker.split(":")[-1] in sandbox_pids
    piped = await workspace.run("tr a-z A-Z", input=b"shout\n")
    assert piped.stdout == "SHOUT\n"
    slow = await workspace.run("sleep 5", timeout_ms=300)
    assert slow.timed_out and slow.exit_code == -1


async def test_removing_the_workspace_removes_its_folder(
    workspace: RunWorkspace, fleet: WorkerFleet
) -> None:
    await workspace.put_files({"x.txt": "x"})
    assert await workspace.remove() is True
    assert not (fleet.settings.workspace_root / workspace.run_id).exists()


async def test_a_workspace_is_removed_only_once_its_call_in_flight_has_ended(
    workspace: RunWorkspace, fleet: WorkerFleet
) -> None:
    folder = fleet.settings.workspace_root / workspace.run_id
    waits_for_go = "touch started; while [ ! -e go ]; do sleep 0.05; done; echo went"
    command = asyncio.create_task(workspace.run(waits_for_go, timeout_ms=60_000))
    await until(lambda: (folder / "started").exists() or command.done(), "the command to start")
    with pytest.raises(FileProblemError) as kept:
        await workspace.remove()
    assert kept.value.kind == "in_use"
    assert str(kept.value).endswith("was kept: a call of the run is in flight")
    assert (folder / "started").exists()
    removal = asyncio.create_task(workspace.remove(wait_s=calls_end_within_s(fleet.settings)))
    (folder / "go").touch()
    assert (await command).stdout == "went\n"
    assert await removal is True
    assert not folder.exists()


async def test_an_operation_nobody_serves_is_a_clear_error(fleet: WorkerFleet) -> None:
    async with Dispatcher(fleet.settings) as dispatcher:
        bare = RunWorkspace(dispatcher, Fleet(tools={}), "ws-none")
        with pytest.raises(ServiceCallError, match=r"no worker of this fleet offers toolq\.exec"):
            await bare.run("true")
