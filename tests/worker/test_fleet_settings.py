"""TOOLQ_OUTPUT_CAP_BYTES and TOOLQ_DEFAULT_TIMEOUT_MS, raised and lowered, as a caller notices
them: in a worker's own handling of calls, in the tools it publishes, and on a real fleet."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import fakeredis
import pytest
import redis

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, RedisServer, WorkerFleet, fleet_settings
from tests.worker.conftest import assert_cut_short, request, worker_settings
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallResult
from worker.executor import Executor
from worker.manifest import fleet_tool_specs
from worker.results import ResultStore

LOW_CAP = 1_000
HIGH_CAP = 200_000
#: A file, a listing and a search whose answers are over the default cap but under the high one.
BIG_FILE_BYTES = 100_000
MATCHING_LINES = 2_000
ENTRIES = 1_000


def executor_with(tmp_path: Path, **settings: Any) -> Executor:
    store = ResultStore(fakeredis.FakeRedis(), 60)
    return Executor(worker_settings(tmp_path, **settings), store, "test-worker:1")


def run_root(tmp_path: Path) -> Path:
    """The workspace of run ``run-1``, the run ``request`` calls in."""
    root = tmp_path / "run-1"
    root.mkdir(exist_ok=True)
    return root


def call(executor: Executor, tool: str, arguments: dict[str, Any]) -> ToolCallResult:
    pool = "sandbox" if tool == "run_bash" else "tools"
    result = executor.handle(request(tool, arguments), pool)
    assert not result.is_error, result.output
    return result


# -- the output cap ----------------------------------------------------------------------------


def test_a_lowered_cap_cuts_a_file_read_with_its_notice_inside_the_cap(tmp_path: Path) -> None:
    content = "".join(f"line {n:06}\n" for n in range(BIG_FILE_BYTES // 12))
    (run_root(tmp_path) / "big.txt").write_text(content)

    read = call(executor_with(tmp_path, output_cap_bytes=LOW_CAP), "read_file", {"path": "big.txt"})

    assert len(read.output.encode()) <= LOW_CAP
    assert read.truncated
    text, notice = read.output.split("\n\n[read_file: ")
    assert content.startswith(text) and len(text) > LOW_CAP // 3
    assert f"big.txt has {len(content):,} bytes" in notice
    assert "answers are capped at 1,000 bytes" in notice


def test_a_raised_cap_lets_the_whole_file_through(tmp_path: Path) -> None:
    content = "x" * (BIG_FILE_BYTES - 1) + "\n"
    (run_root(tmp_path) / "big.txt").write_text(content)

    read = call(
        executor_with(tmp_path, output_cap_bytes=HIGH_CAP), "read_file", {"path": "big.txt"}
    )

    assert read.output == content
    assert not read.truncated


def _many_matches_and_entries(root: Path) -> None:
    lines = "".join(f"needle number {n:05} in a haystack\n" for n in range(MATCHING_LINES))
    (root / "hay.txt").write_text(lines)
    folder = root / "many"
    folder.mkdir()
    for number in range(ENTRIES):
        (folder / f"{'entry-' * 8}{number:04}.txt").touch()


@dataclass(frozen=True)
class Listing:
    """A call whose answer lists ``count`` things, each on a line holding ``item``."""

    tool: str
    arguments: dict[str, Any]
    item: str
    count: int
    what: str


LISTINGS = [
    Listing(
        "search_text",
        {"query": "needle", "paths": ["hay.txt"]},
        "hay.txt:",
        MATCHING_LINES,
        "matches",
    ),
    Listing("list_dir", {"path": "many"}, ".txt (0 bytes)", ENTRIES, "entries"),
    Listing("search_files", {"pattern": "many/*.txt"}, ".txt", ENTRIES, "paths"),
]


@pytest.fixture(params=LISTINGS, ids=lambda listing: listing.tool)
def listing(request: pytest.FixtureRequest, tmp_path: Path) -> Listing:
    """A listing, with what it lists in the workspace of run ``run-1``."""
    _many_matches_and_entries(run_root(tmp_path))
    chosen: Listing = request.param
    return chosen


def test_searches_and_listings_stay_within_a_lowered_cap(tmp_path: Path, listing: Listing) -> None:
    answer = call(
        executor_with(tmp_path, output_cap_bytes=LOW_CAP), listing.tool, listing.arguments
    )

    assert len(answer.output.encode()) <= LOW_CAP
    assert answer.truncated
    assert_cut_short(answer.output, listing.item, listing.count, listing.what)


def test_searches_and_listings_show_everything_under_a_raised_cap(
    tmp_path: Path, listing: Listing
) -> None:
    answer = call(
        executor_with(tmp_path, output_cap_bytes=HIGH_CAP), listing.tool, listing.arguments
    )

    assert len(answer.output.encode()) > DEFAULT_OUTPUT_CAP_BYTES  # more than the default allows
    assert not answer.truncated
    assert answer.output.count(listing.item) == listing.count
    assert "not shown" not in answer.output


@pytest.mark.parametrize("cap", [LOW_CAP, HIGH_CAP])
def test_run_bash_keeps_each_stream_within_the_cap(tmp_path: Path, cap: int) -> None:
    executor = executor_with(tmp_path, output_cap_bytes=cap, sandbox_isolation="process")

    ran = call(executor, "run_bash", {"command": "head -c 150000 /dev/zero | tr '\\0' y"})

    stdout = json.loads(ran.output)["stdout"]
    if cap == LOW_CAP:
        assert stdout == "y" * LOW_CAP + (
            "\n[output truncated: showing the first 1,000 of 150,000 bytes]"
        )
    else:
        assert stdout == "y" * 150_000


# -- the default deadline ----------------------------------------------------------------------


@pytest.mark.parametrize("default_ms", [1_500, 90_000])
def test_tools_without_their_own_deadline_publish_the_fleets_default(
    tmp_path: Path, default_ms: int
) -> None:
    settings = WorkerSettings(
        workspace_root=tmp_path,
        plugins=["tests.plugins.probe_tools"],
        default_timeout_ms=default_ms,
    )

    specs = {spec.name: spec.default_timeout_ms for spec in fleet_tool_specs(settings)}

    assert specs["read_file"] == specs["slow_read"] == default_ms
    assert specs["run_bash"] == 30_000  # its own, the default of its `timeout` argument
    assert specs["stubborn"] == 500  # a plugin tool's own


def test_a_published_default_never_passes_the_largest_deadline(tmp_path: Path) -> None:
    settings = WorkerSettings(
        workspace_root=tmp_path,
        plugins=["tests.plugins.probe_tools"],
        default_timeout_ms=90_000,
        max_timeout_ms=20_000,
    )

    specs = {spec.name: spec.default_timeout_ms for spec in fleet_tool_specs(settings)}

    assert specs["slow_read"] == specs["run_bash"] == 20_000
    assert specs["stubborn"] == 500


# -- on a real fleet ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def low_fleet(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerFleet]:
    """A fleet of its own, on a database of its own, with both settings lowered."""
    url = redis_server.url.rsplit("/", 1)[0] + "/6"
    redis.Redis.from_url(url).flushdb()
    root = tmp_path_factory.mktemp("low-workspaces")
    os.chmod(root, 0o755)
    settings = fleet_settings(url, root, default_timeout_ms=1_000, output_cap_bytes=LOW_CAP)
    workers = WorkerFleet(settings, concurrency=1).start()
    yield workers
    workers.stop()


@pytest.mark.integration
async def test_a_fleet_with_a_lowered_default_stops_a_slow_call_at_it(
    low_fleet: WorkerFleet, call: Caller
) -> None:
    async with Dispatcher(low_fleet.settings) as dispatcher:
        low = Caller(dispatcher, low_fleet.settings, "run-low")
        cut = await low("slow_read", {"seconds": 1.5})
    # The session's fleet has the default raised to 10 s: the same call ends there.
    done = await call("slow_read", {"seconds": 1.5})

    assert low.specs["slow_read"].default_timeout_ms == 1_000
    assert cut.error_kind == "timeout"
    assert "timed out after 1000 ms" in cut.output
    assert call.specs["slow_read"].default_timeout_ms == 10_000
    assert done.output == "slept 1.5s"


@pytest.mark.integration
async def test_a_fleet_with_a_lowered_cap_cuts_a_file_read(low_fleet: WorkerFleet) -> None:
    async with Dispatcher(low_fleet.settings) as dispatcher:
        low = Caller(dispatcher, low_fleet.settings, "run-low-cap")
        wrote = await low("write_file", {"path": "big.txt", "content": "z" * BIG_FILE_BYTES})
        read = await low("read_file", {"path": "big.txt"})

    assert not wrote.is_error, wrote.output
    assert len(read.output.encode()) <= LOW_CAP
    assert read.truncated
    assert read.output.startswith("z" * 400)
    assert "answers are capped at 1,000 bytes" in read.output
