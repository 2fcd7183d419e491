"""A worker's handling of one call, against fakeredis: once-only results and safe redelivery."""

from __future__ import annotations

import json
import logging
import shutil
import time
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from api.calls.dispatch import Dispatcher
from tests.worker.conftest import REPLY, replies, request, worker_settings
from worker.contract.keys import keys
from worker.contract.limits import cap_text
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolSpec
from worker.executor import Executor
from worker.results import ResultStore


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    return worker_settings(tmp_path, disabled_tools=["move"], output_cap_bytes=1000)


def test_a_call_is_run_stored_and_answered(executor: Executor, client: fakeredis.FakeRedis) -> None:
    result = executor.handle(request("write_file", {"path": "a.txt", "content": "hi"}), "tools")
    assert not result.is_error
    assert result.worker == "test-worker:1"
    assert replies(client) == [result]
    assert client.get(keys.result(result.task_id)) is not None


def test_a_finished_call_delivered_again_is_answered_without_running(
    executor: Executor, client: fakeredis.FakeRedis, settings: WorkerSettings
) -> None:
    body = request("slow_write", {"marker": "m"}, task_id="same")
    first = executor.handle(body, "tools")
    second = executor.handle(body, "tools")
    assert second == first
    runs = Path(settings.workspace_root) / "run-1" / "m.runs"
    assert runs.read_text().count("\n") == 1
    assert len(replies(client)) == 2


@pytest.mark.parametrize(("tool", "kind"), [("slow_write", "interrupted"), ("slow_read", None)])
def test_an_interrupted_call_is_rerun_only_when_safe(
    executor: Executor, client: fakeredis.FakeRedis, tool: str, kind: str | None
) -> None:
    client.set(keys.started("cut"), "dead-worker:9")
    result = executor.handle(request(tool, {"marker": "x"}, task_id="cut"), "tools")
    assert result.error_kind == kind
    if kind:
        assert "dead-worker:9" in result.output
        assert "outcome is unknown" in result.output


def test_run_bash_cut_short_elsewhere_never_starts_its_command(
    executor: Executor, client: fakeredis.FakeRedis, settings: WorkerSettings
) -> None:
    # run_bash waits for its start marker's answer only as its command is handed over: a
    # launch is ready by then, and must be let go with nothing run.
    client.set(keys.started("cut-bash"), "dead-worker:9")
    cut = executor.handle(
        request("run_bash", {"command": "touch ran"}, task_id="cut-bash"), "sandbox"
    )
    assert cut.error_kind == "interrupted"
    assert "dead-worker:9" in cut.output
    assert not (Path(settings.workspace_root) / "run-1" / "ran").exists()
    after = executor.handle(request("run_bash", {"command": "touch ran"}), "sandbox")
    assert json.loads(after.output)["exit_code"] == 0
    assert (Path(settings.workspace_root) / "run-1" / "ran").exists()


def test_run_bash_answered_before_is_answered_again_not_run(
    executor: Executor, client: fakeredis.FakeRedis, settings: WorkerSettings
) -> None:
    first = executor.handle(
        request("run_bash", {"command": "echo once >>runs"}, task_id="b"), "sandbox"
    )
    again = executor.handle(
        request("run_bash", {"command": "echo once >>runs"}, task_id="b"), "sandbox"
    )
    assert again == first
    assert (Path(settings.workspace_root) / "run-1" / "runs").read_text() == "once\n"
    assert replies(client) == [first, first]


def test_run_bash_that_fails_before_its_command_still_marks_the_call(
    executor: Executor, client: fakeredis.FakeRedis
) -> None:
    # Refused before anything started (no such folder): the marker's answer is still read, and
    # the connection it came on goes back to the pool clean.
    body = request("run_bash", {"command": "true", "cwd": "missing"}, task_id="no-cwd")
    refused = executor.handle(body, "sandbox")
    assert refused.is_error and "missing" in refused.output
    assert client.get(keys.started("no-cwd")) == b"1 test-worker:1"  # the first message
    assert executor.handle(body, "sandbox") == refused  # stored: answered again, not re-run


def test_a_plugin_tool_that_admits_itself_starts_its_effects_only_when_admitted(
    settings: WorkerSettings, client: fakeredis.FakeRedis
) -> None:
    settings = settings.model_copy(update={"plugins": ["tests.plugins.late_effects"]})
    executor = Executor(settings, ResultStore(client, 60), "test-worker:1")
    folder = Path(settings.workspace_root) / "run-1"
    client.set(keys.started("cut-late"), "dead-worker:9")
    cut = executor.handle(request("late_write", {"name": "a"}, task_id="cut-late"), "tools")
    assert cut.error_kind == "interrupted"
    assert (folder / "a.prepared").exists()  # it prepared while the marker's answer came
    assert not (folder / "a").exists()
    done = executor.handle(request("late_write", {"name": "b"}), "tools")
    assert done.output == "written" and (folder / "b").read_text() == "written"


def test_a_call_for_another_pool_is_refused(executor: Executor) -> None:
    result = executor.handle(request("run_bash", {"command": "id"}), "tools")
    assert result.error_kind == "wrong_pool"
    result = executor.handle(request("read_file", {"path": "x"}), "sandbox")
    assert result.error_kind == "wrong_pool"


def test_a_call_past_its_deadline_is_not_started(executor: Executor) -> None:
    result = executor.handle(request("noop", {}, deadline=time.time() - 1), "tools")
    assert result.error_kind == "timeout"
    assert "deadline passed" in result.output


def test_a_fleet_disabled_tool_is_refused(executor: Executor) -> None:
    result = executor.handle(request("move", {"source": "a", "destination": "b"}), "tools")
    assert result.error_kind == "tool_disabled"


@pytest.mark.parametrize("raw", ["text", 42, {"tool": "x"}, {"task_id": "i", "run_id": "../"}])
def test_a_malformed_request_gets_a_bad_request_answer(
    executor: Executor, client: fakeredis.FakeRedis, raw: Any
) -> None:
    if isinstance(raw, dict):
        raw = {**raw, "reply_to": REPLY}
    result = executor.handle(raw, "tools")
    assert result.error_kind == "bad_request"
    assert "invalid request" in result.output
    if isinstance(raw, dict):
        assert replies(client)[-1].error_kind == "bad_request"


def test_answers_are_capped_but_run_bash_keeps_its_own_json(executor: Executor) -> None:
    executor.handle(request("write_file", {"path": "big.txt", "content": "y" * 5000}), "tools")
    read = executor.handle(request("read_file", {"path": "big.txt"}), "tools")
    assert read.truncated
    assert len(read.output.encode()) <= 1000
    command = "head -c 3000 big.txt; head -c 3000 big.txt >&2"
    bash = executor.handle(request("run_bash", {"command": command}), "sandbox")
    answer = json.loads(bash.output)  # each stream capped on its own, the JSON intact
    assert answer["stdout"].startswith("y" * 500)
    assert answer["stderr"].startswith("y" * 500)
    assert answer["truncated"] == {"stdout": True, "stderr": True}
    assert not bash.truncated


def test_the_hard_limit_answer_names_the_limit(
    executor: Executor, client: fakeredis.FakeRedis
) -> None:
    executor.store_timeout(request("stubborn", {}, task_id="stuck"), 2.5)
    (answer,) = replies(client)
    assert answer.error_kind == "timeout"
    assert "2.5 s" in answer.output


def test_cap_text_cuts_on_a_character_boundary() -> None:
    text, cut = cap_text("é" * 1000, 301)
    assert cut
    assert len(text.encode()) <= 301
    assert text.startswith("é")
    assert "output truncated: 2,000 bytes" in text
    assert cap_text("short", 301) == ("short", False)


def _spec(**overrides: Any) -> ToolSpec:
    values: dict[str, Any] = {
        "name": "run_bash",
        "description": "",
        "parameters": {},
        "pool": "sandbox",
        "enabled_by_default": False,
        "idempotent": False,
        "default_timeout_ms": 30_000,
        "timeout_argument": "timeout",
    }
    values.update(overrides)
    return ToolSpec(**values)


async def test_a_call_deadline_follows_the_tools_own_timeout_within_the_maximum(
    settings: WorkerSettings,
) -> None:
    dispatcher = Dispatcher(settings.model_copy(update={"max_timeout_ms": 60_000}))
    try:
        build = dispatcher.build_request
        assert build(_spec(), task_id="a", run_id="r", arguments={}).timeout_ms == 30_000
        own = build(_spec(), task_id="b", run_id="r", arguments='{"timeout": 2000}')
        assert own.timeout_ms == 3000  # its own limit plus time to report
        huge = build(_spec(), task_id="c", run_id="r", arguments={"timeout": 10**9})
        assert huge.timeout_ms == 60_000
        override = build(_spec(), task_id="d", run_id="r", arguments={}, timeout_ms=500)
        assert override.timeout_ms == 500
        assert override.reply_to == dispatcher.reply_key
        assert override.deadline > time.time()
    finally:
        await dispatcher.close()


def test_a_runs_workspace_removed_between_calls_is_made_again(
    executor: Executor, settings: WorkerSettings
) -> None:
    first = executor.handle(request("write_file", {"path": "a.txt", "content": "one"}), "tools")
    run_root = Path(settings.workspace_root) / "run-1"
    assert (run_root / "a.txt").read_text() == "one"
    shutil.rmtree(run_root)

    # run_bash starts its command in the root: it must be there again.
    ran = executor.handle(request("run_bash", {"command": "pwd"}), "sandbox")

    assert not first.is_error
    assert not ran.is_error, ran.output
    assert json.loads(ran.output)["exit_code"] == 0


def test_a_tool_that_raises_is_logged_with_the_calls_ids_not_its_arguments(
    executor: Executor, caplog: pytest.LogCaptureFixture
) -> None:
    secret = "canary-payload-77e1"
    with caplog.at_level(logging.WARNING):
        result = executor.handle(
            request("explode", {"payload": secret}, tool_call_id="call_model_7"), "tools"
        )

    assert result.output == "Error executing explode: disk on fire"
    [record] = [r for r in caplog.records if r.name == "worker.tools.registry"]
    assert (record.run_id, record.tool_call_id) == ("run-1", "call_model_7")  # type: ignore[attr-defined]
    assert record.exc_info is not None and "disk on fire" in caplog.text
    assert secret not in caplog.text
