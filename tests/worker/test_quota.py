"""The workspace quota: measured after the calls that can add to a workspace, told in their
answers past the quota, and the tools that add refused until the run frees space."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from tests.worker.conftest import request
from worker.contract.settings import WorkerSettings, get_worker_settings
from worker.contract.wire import ToolCallResult
from worker.exceptions import WorkspaceError
from worker.executor import Executor
from worker.quota import WorkspaceQuota, measure
from worker.results import ResultStore
from worker.tools.filesystem import WriteFileTool
from worker.tools.workspace import Workspace

QUOTA = 64 * 1024


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    tmp_path.chmod(0o755)  # run_bash's user reaches the run folders
    return WorkerSettings(
        broker_url="redis://localhost:1/0",
        workspace_root=tmp_path,
        workspace_quota_bytes=QUOTA,
    )


@pytest.fixture
def executor(settings: WorkerSettings) -> Executor:
    return Executor(settings, ResultStore(fakeredis.FakeRedis(), 60), "test-worker:1")


def write(executor: Executor, path: str, size: int) -> ToolCallResult:
    return executor.handle(request("write_file", {"path": path, "content": "x" * size}), "tools")


def test_measure_counts_disk_blocks_each_hard_link_once_and_no_link_target(
    tmp_path: Path,
) -> None:
    (tmp_path / "a").write_bytes(b"a" * 100_000)
    os.link(tmp_path / "a", tmp_path / "a-again")
    (tmp_path / "elsewhere").symlink_to("/usr")
    sparse = tmp_path / "sparse"
    with sparse.open("wb") as file:
        file.truncate(1 << 30)  # a gigabyte long, nothing on disk

    found = measure(tmp_path)

    assert found.complete
    assert 100_000 <= found.used_bytes < 200_000


def test_a_walk_out_of_time_counts_what_it_saw(tmp_path: Path) -> None:
    for index in range(50):
        (tmp_path / f"d{index}").mkdir()

    found = measure(tmp_path, bound_s=0)

    assert not found.complete


def test_past_the_quota_the_answer_says_so_and_writes_are_refused(executor: Executor) -> None:
    under = write(executor, "a.txt", QUOTA // 2)
    over = write(executor, "b.txt", QUOTA)
    refused = write(executor, "c.txt", 10)
    bash_refused = executor.handle(request("run_bash", {"command": "true"}), "sandbox")
    read = executor.handle(request("read_file", {"path": "a.txt"}), "tools")

    assert not under.is_error and "quota" not in under.output
    assert not over.is_error
    assert "past its quota of 64.0 KiB" in over.output
    assert "remove" in over.output
    assert refused.error_kind == "over_quota"
    assert "write_file was not started" in refused.output
    assert bash_refused.error_kind == "over_quota"
    assert not read.is_error  # reading is never refused


def test_removing_files_lifts_the_refusal(executor: Executor, settings: WorkerSettings) -> None:
    write(executor, "big.txt", QUOTA * 2)
    assert write(executor, "small.txt", 1).error_kind == "over_quota"

    removed = executor.handle(request("remove", {"path": "big.txt"}), "tools")
    again = write(executor, "small.txt", 1)

    assert not removed.is_error
    assert not again.is_error, again.output
    assert not list((Path(settings.workspace_root) / ".toolq" / "over-quota").iterdir())


def test_past_the_quota_write_file_may_shrink_a_file_as_the_answer_says(
    executor: Executor, settings: WorkerSettings
) -> None:
    """remove and run_bash are off by default: the way out must be a tool that is on."""
    over = write(executor, "big.txt", QUOTA * 2)
    growing = write(executor, "big.txt", QUOTA * 2 + 1)
    other = write(executor, "other.txt", 1)
    emptied = write(executor, "big.txt", 0)
    again = write(executor, "small.txt", 1)

    assert "make files smaller with write_file" in over.output
    assert growing.error_kind == "over_quota"
    assert "empty content empties a file" in growing.output
    assert other.error_kind == "over_quota"
    assert not emptied.is_error, emptied.output
    assert (Path(settings.workspace_root) / "run-1" / "big.txt").stat().st_size == 0
    assert not again.is_error, again.output


def test_a_hard_link_past_the_quota_is_not_a_way_out(
    executor: Executor, settings: WorkerSettings
) -> None:
    """Overwriting one name of a file that has two frees nothing."""
    write(executor, "big.txt", QUOTA * 2)
    folder = Path(settings.workspace_root) / "run-1"
    os.link(folder / "big.txt", folder / "twin.txt")

    refused = write(executor, "big.txt", 0)

    assert refused.error_kind == "over_quota"


def test_run_bash_past_the_quota_says_so_in_its_json(executor: Executor) -> None:
    command = f"head -c {QUOTA * 2} /dev/zero > big.bin; echo written"

    result = executor.handle(request("run_bash", {"command": command}), "sandbox")

    assert not result.is_error, result.output
    answer = json.loads(result.output)
    assert answer["stdout"] == "written\n"
    assert "past its quota" in answer["notice"]


def test_a_quota_of_zero_measures_nothing(settings: WorkerSettings) -> None:
    unlimited = Executor(
        settings.model_copy(update={"workspace_quota_bytes": 0}),
        ResultStore(fakeredis.FakeRedis(), 60),
        "test-worker:1",
    )

    first = write(unlimited, "a.txt", QUOTA * 2)
    second = write(unlimited, "b.txt", 10)

    assert "quota" not in first.output
    assert not second.is_error


def test_every_worker_sharing_the_root_honours_the_mark(tmp_path: Path) -> None:
    one, other = WorkspaceQuota(tmp_path, 100), WorkspaceQuota(tmp_path, 100)
    (tmp_path / "run-1").mkdir()
    (tmp_path / "run-1" / "f").write_bytes(b"x" * 5000)

    notice = one.account("run-1", tmp_path / "run-1")

    assert notice is not None
    assert other.refusal("run-1") is not None
    assert other.refusal("run-2") is None
    other.forget("run-1")
    assert one.refusal("run-1") is None


def test_a_command_reports_its_usage_in_the_result(executor: Executor) -> None:
    bash = executor.handle(request("run_bash", {"command": "sleep 30 & echo"}), "sandbox")
    written = write(executor, "a.txt", 10)

    answer = json.loads(bash.output)
    assert bash.usage is not None
    assert bash.usage.model_dump() == answer["usage"]
    assert bash.usage.cpu_ms is not None
    assert written.usage is None


@pytest.fixture
def full_disk(tmp_path: Path) -> Iterator[Path]:
    """A file system of 64 KiB of its own, as a run volume is of the quota's size."""
    if os.geteuid() != 0:
        pytest.skip("mounting a file system needs root")
    mounted = tmp_path / "volume"
    mounted.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mounted)], check=True, timeout=30
    )
    try:
        yield mounted
    finally:
        subprocess.run(["umount", "-l", str(mounted)], check=False, timeout=30)


def test_a_write_past_a_run_volume_names_the_workspace_quota(
    full_disk: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TOOLQ_WORKSPACE_QUOTA_FS", "loop")
    monkeypatch.setenv("TOOLQ_WORKSPACE_QUOTA_BYTES", str(QUOTA))
    get_worker_settings.cache_clear()
    try:
        with pytest.raises(WorkspaceError) as refused:
            WriteFileTool(Workspace(full_disk)).execute(
                {"path": "big.txt", "content": "x" * QUOTA * 2}
            )
    finally:
        get_worker_settings.cache_clear()

    assert str(refused.value) == (
        "'big.txt': the workspace is full at its quota of 64.0 KiB (TOOLQ_WORKSPACE_QUOTA_BYTES="
        "65536); make files smaller with write_file (the same path with "
        "shorter content; empty content empties a file), or delete them with remove where that "
        "tool is on"
    )
