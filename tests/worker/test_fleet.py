"""Tool calls as Celery tasks on real worker processes and a real Redis."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import redis
from kombu import Connection, Exchange, Producer

from api.calls.fleet import live_workers, read_manifest
from tests.conftest import Caller, WorkerFleet, wait_for
from tests.plugins.probe_tools import AREA_PARAMETERS
from tests.worker.conftest import BUILT_INS
from worker.contract.wire import PER_PROCESS_MEMORY

pytestmark = pytest.mark.integration


def workspace(call: Caller) -> Path:
    return Path(call.settings.workspace_root) / call.run_id


async def test_every_builtin_tool_round_trips(call: Caller) -> None:
    write = await call("write_file", {"path": "docs/a.txt", "content": "hello celery\nbye\n"})
    assert not write.is_error, write.output
    assert (workspace(call) / "docs" / "a.txt").read_text() == "hello celery\nbye\n"
    read = await call("read_file", '{"path": "docs/a.txt"}')
    assert read.output == "hello celery\nbye\n"
    assert read.worker and read.duration_ms > 0
    assert not (await call("mkdir", {"path": "x/y"})).is_error
    listing = await call("list_dir", {"path": "."})
    assert "docs" in listing.output and "x" in listing.output
    moved = await call("move", {"source": "docs/a.txt", "destination": "x/b.txt"})
    assert not moved.is_error, moved.output
    found = await call("search_text", {"query": "celery", "paths": ["."]})
    assert "x/b.txt:1:hello celery" in found.output
    files = await call("search_files", {"pattern": "**/*.txt"})
    assert "x/b.txt" in files.output
    saved = await call("save_session_context", {"reason": "checkpoint"})
    assert not saved.is_error, saved.output
    assert json.loads((workspace(call) / "session_context.json").read_text())["reason"] == (
        "checkpoint"
    )
    removed = await call("remove", {"path": "x"})
    assert not removed.is_error and not (workspace(call) / "x").exists()
    weather = await call("get_current_weather", {"location": "Paris"})
    assert "Sunny" in weather.output and "Paris" in weather.output


async def test_run_bash_runs_on_the_sandbox_pool(call: Caller) -> None:
    await call("write_file", {"path": "n.txt", "content": "12345"})
    result = await call("run_bash", {"command": "wc -c < n.txt"})
    assert not result.is_error, result.output
    answer = json.loads(result.output)
    assert answer["stdout"].strip() == "5" and answer["exit_code"] == 0
    assert call.specs["run_bash"].pool == "sandbox"


async def test_a_sandbox_worker_publishes_its_limits(fleet: WorkerFleet) -> None:
    client = redis.Redis.from_url(fleet.settings.redis_url)
    try:
        (sandbox,) = live_workers(client, "sandbox")
        (tools,) = live_workers(client, "tools")
    finally:
        client.close()
    assert sandbox.limits is not None and sandbox.limits.sandbox is not None
    box = sandbox.limits.sandbox
    assert (box.memory_mb, box.max_processes) == (1024, 256)
    assert box.memory_by in ("cgroup v2", "cgroup v1", PER_PROCESS_MEMORY)
    assert box.processes_by in ("cgroup v2", "cgroup v1", "rlimit (per user)")
    assert box.isolation[:2] == ["process-group", "clean-environment"]
    assert sandbox.limits.workspace_quota_bytes == 1 << 30
    assert tools.limits is not None and tools.limits.sandbox is None


async def test_the_manifest_tells_tools_pools_and_defaults(call: Caller) -> None:
    specs = call.specs
    assert list(specs)[: len(BUILT_INS)] == BUILT_INS
    assert not specs["bash_session"].enabled_by_default
    assert not specs["remove"].enabled_by_default and not specs["run_bash"].enabled_by_default
    assert specs["read_file"].enabled_by_default and specs["read_file"].idempotent
    assert specs["get_current_weather"].pool == "tools"


async def test_a_plugins_function_tools_are_published_and_check_their_arguments(
    call: Caller,
) -> None:
    repeat, area = call.specs["repeat"], call.specs["area"]
    assert repeat.idempotent and repeat.pool == "tools"
    assert repeat.parameters["properties"]["word"]["description"] == "The word to repeat."
    assert area.parameters == AREA_PARAMETERS and area.description == "A rectangle's area."

    repeated = await call("repeat", {"word": "hey", "times": 3})
    measured = await call("area", '{"width": 2, "height": 3.5}')
    bad = await call("area", {"width": -1})

    assert repeated.output == "hey hey hey"
    assert json.loads(measured.output) == {"area": 7.0}
    assert bad.error_kind == "invalid_arguments"
    assert bad.output.startswith("Error: invalid arguments for area: ")
    assert "'width': -1 is less than the minimum of 0" in bad.output
    assert "'height': Field required" in bad.output


async def test_a_tool_that_raises_is_logged_by_its_worker_with_the_calls_ids(
    call: Caller, fleet: WorkerFleet
) -> None:
    secret = "canary-payload-3b9d"
    result = await call("explode", {"payload": secret}, tool_call_id="call_logged_1")

    assert result.output == "Error executing explode: disk on fire"
    wait_for(
        lambda: "tool_call_id=call_logged_1" in fleet.log("tools", 100_000),
        what="the worker to log the failed call",
    )
    log = fleet.log("tools", 100_000)
    [line] = [line for line in log.splitlines() if "tool_call_id=call_logged_1" in line]
    assert "WARNING" in line and "explode" in line and f"run_id={call.run_id}" in line
    assert "RuntimeError: disk on fire" in log
    assert secret not in log


async def test_many_calls_in_parallel_all_answer(call: Caller) -> None:
    results = await asyncio.gather(*(call("noop", {}) for _ in range(200)))
    assert [r.output for r in results] == ["ok"] * 200
    assert len({r.worker for r in results}) >= 2  # both pool processes took calls


async def test_unknown_tool_and_bad_arguments_are_answered(call: Caller) -> None:
    unknown = await call("no_such_tool", {})
    assert unknown.error_kind == "unknown_tool" and "not found" in unknown.output
    bad = await call("read_file", '{"path": ')
    assert bad.error_kind == "invalid_arguments" and "not valid JSON" in bad.output
    unserialisable = await call("bad_return", {})
    assert unserialisable.error_kind == "unserializable_result"


async def test_every_answer_is_capped(call: Caller) -> None:
    await call("write_file", {"path": "big.txt", "content": "x" * 200_000})
    result = await call("search_text", {"query": "x", "paths": ["big.txt"]})
    assert len(result.output.encode()) <= call.settings.output_cap_bytes


async def test_a_tool_past_its_deadline_is_stopped(call: Caller) -> None:
    result = await call("slow_read", {"seconds": 30}, timeout_ms=300)
    assert result.error_kind == "timeout"
    assert "300 ms" in result.output
    # The slot is free again.
    assert (await call("noop", {})).output == "ok"


async def test_a_tool_that_ignores_its_soft_limit_is_stopped_by_the_hard_one(
    call: Caller, fleet: WorkerFleet
) -> None:
    result = await call("stubborn", {}, timeout_ms=300)
    assert result.error_kind == "timeout"
    assert "hard time limit" in result.output
    results = await asyncio.gather(*(call("noop", {}) for _ in range(4)))
    assert all(r.output == "ok" for r in results)


async def test_a_crafted_call_for_the_wrong_pool_is_refused(call: Caller) -> None:
    bash = await call("run_bash", {"command": "touch /tmp/pwned-by-toolq"}, pool="tools")
    assert bash.error_kind == "wrong_pool" and "sandbox" in bash.output
    assert not Path("/tmp/pwned-by-toolq").exists()
    read = await call("read_file", {"path": "x"}, pool="sandbox")
    assert read.error_kind == "wrong_pool"


async def test_a_non_json_message_is_refused_and_the_worker_keeps_serving(
    call: Caller, fleet: WorkerFleet
) -> None:
    with Connection(fleet.settings.effective_broker_url) as conn:
        producer = Producer(conn.default_channel, exchange=Exchange("tools", type="direct"))
        producer.publish(
            {"not": "json"},
            routing_key="tools",
            serializer="pickle",
            headers={"task": "toolq.execute_tool", "id": str(uuid.uuid4())},
        )
        producer.publish(
            "definitely not a request",
            routing_key="tools",
            serializer="json",
            headers={"task": "toolq.execute_tool", "id": str(uuid.uuid4())},
        )
    assert (await call("noop", {})).output == "ok"
    wait_for(lambda: "disallowed" in fleet.log("tools").lower(), what="the refusal logged")


async def test_a_redelivered_call_that_finished_is_not_run_again(call: Caller) -> None:
    # The same message twice, as the broker redelivers it: same id, same key.
    spec = call.spec("slow_write")
    request = call.dispatcher.build_request(
        spec, task_id="fixed-id-1", run_id=call.run_id, arguments={"marker": "once"}
    )
    first = await call.dispatcher.call(request, spec.pool)
    again = await call.dispatcher.call(request, spec.pool)
    assert again.output == first.output == "slept 0.0s"
    assert (workspace(call) / "once.runs").read_text().count("\n") == 1


async def test_a_queue_without_workers_answers_no_answer(redis_server: object) -> None:
    from api.calls.dispatch import Dispatcher
    from tests.conftest import fleet_settings

    url = redis_server.url.rsplit("/", 1)[0] + "/5"  # type: ignore[attr-defined]
    settings = fleet_settings(url, Path("/tmp"), hard_limit_grace_s=0.2, reply_margin_s=0.3)
    async with Dispatcher(settings) as dispatcher:
        caller = Caller(dispatcher, settings, "run-empty")
        result = await caller("noop", {}, timeout_ms=100)
    assert result.error_kind == "no_answer"
    assert "no worker is serving the 'tools' queue" in result.output
    assert "after" in result.output


def _child_running(fleet: WorkerFleet, runs: Path) -> int:
    wait_for(lambda: runs.exists() and runs.read_text().strip() != "", what="the call to start")
    pid = int(runs.read_text().split()[0])
    assert pid in fleet.worker_pids("tools")
    return pid


@pytest.fixture
def own_fleet(redis_server: object, tmp_path: Path) -> Iterator[WorkerFleet]:
    """A fleet of its own for a test that kills or disturbs workers."""
    from tests.conftest import fleet_settings

    db = 1 + (os.getpid() % 4)
    url = redis_server.url.rsplit("/", 1)[0] + f"/{db}"  # type: ignore[attr-defined]
    redis.Redis.from_url(url).flushdb()
    tmp_path.chmod(0o755)
    fleet = WorkerFleet(fleet_settings(url, tmp_path)).start()
    yield fleet
    fleet.stop()


@pytest.mark.parametrize(("tool", "expected_runs"), [("slow_read", 2), ("slow_write", 1)])
async def test_a_worker_killed_mid_call(
    own_fleet: WorkerFleet, tool: str, expected_runs: int
) -> None:
    from api.calls.dispatch import Dispatcher

    async with Dispatcher(own_fleet.settings) as dispatcher:
        caller = Caller(dispatcher, own_fleet.settings, f"run-kill-{tool}")
        runs = Path(own_fleet.settings.workspace_root) / caller.run_id / "k.runs"
        pending = asyncio.ensure_future(caller(tool, {"seconds": 1.5, "marker": "k"}))
        pid = await asyncio.to_thread(_child_running, own_fleet, runs)
        os.kill(pid, signal.SIGKILL)
        result = await asyncio.wait_for(pending, 30)
    if tool == "slow_read":
        assert not result.is_error and result.output == "slept 1.5s"
    else:
        assert result.error_kind == "interrupted"
        assert "outcome is unknown" in result.output
    assert runs.read_text().count("\n") == expected_runs


async def test_workers_survive_a_broker_restart(tmp_path: Path) -> None:
    from api.calls.dispatch import Dispatcher
    from tests.conftest import RedisServer, fleet_settings

    server = RedisServer(tmp_path)
    server.start()
    fleet = WorkerFleet(fleet_settings(server.url, tmp_path)).start()
    try:
        server.stop()
        server.start()
        client = redis.Redis.from_url(server.url)
        wait_for(lambda: bool(read_manifest(client)), 30, "workers to republish their manifest")
        async with Dispatcher(fleet.settings) as dispatcher:
            caller = Caller(dispatcher, fleet.settings, "run-restart")
            result = await caller("noop", {})
        assert result.output == "ok"
    finally:
        fleet.stop()
        server.stop()


async def test_a_local_stack_starts_a_worker_again_after_it_exits(own_fleet: WorkerFleet) -> None:
    from api.calls.dispatch import Dispatcher

    first = own_fleet.worker_pids("tools")[0]
    os.kill(first, signal.SIGKILL)
    wait_for(lambda: own_fleet.worker_pids("tools")[0] != first, 10, "a new tools worker")
    async with Dispatcher(own_fleet.settings) as dispatcher:
        result = await Caller(dispatcher, own_fleet.settings, "run-again")("noop", {})
    assert result.output == "ok"


async def test_a_worker_on_a_workspace_root_not_made_yet_serves_and_prunes(
    tmp_path: Path,
) -> None:
    from api.calls.dispatch import Dispatcher
    from tests.conftest import RedisServer, fleet_settings

    server = RedisServer(tmp_path)
    server.start()
    tmp_path.chmod(0o755)
    root = tmp_path / "new" / "workspaces"
    # The shortest lifetime: each worker looks for expired workspaces every second.
    fleet = WorkerFleet(fleet_settings(server.url, root, workspace_ttl_s=1)).start()
    try:
        async with Dispatcher(fleet.settings) as dispatcher:
            written = await Caller(dispatcher, fleet.settings, "run-late")(
                "write_file", {"path": "a.txt", "content": "a"}
            )
        assert not written.is_error, written.output
        wait_for(lambda: not (root / "run-late").exists(), 60, "the idle workspace to be removed")
        for pool in ("tools", "sandbox"):
            assert "housekeeping" not in fleet.log(pool), fleet.log(pool)
    finally:
        fleet.stop()
        server.stop()
