"""The Celery task around the executor: which messages reach it, which pool a call is for, and
the answer given for a call whose worker child was replaced."""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import fakeredis
import pytest
from celery.contrib.testing.mocks import TaskMessage
from celery.exceptions import InvalidTaskError, TimeLimitExceeded

from tests.worker.conftest import replies, request
from worker import tasks
from worker.app import app
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.contract.wire import TASK_NAME, ToolCallResult, start_mark
from worker.exceptions import ToolCallFailed
from worker.executor import Executor
from worker.plumbing.celery_guard import ValidatedRequest
from worker.results import ResultStore


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    return WorkerSettings(broker_url="redis://localhost:1/0", workspace_root=tmp_path)


@pytest.fixture
def executor(
    settings: WorkerSettings, store: ResultStore, monkeypatch: pytest.MonkeyPatch
) -> Executor:
    """The process's executor, on fakeredis."""
    made = Executor(settings, store, "test-worker:1")
    monkeypatch.setattr(tasks, "executor", lambda: made)
    return made


@pytest.mark.parametrize(
    "body",
    [
        "a JSON string",
        {"tool": "read_file"},
        [[], {}],
        [{}, {}, {}],
        [[], [], {}],
        [[], {}, {}, {}],
    ],
)
def test_a_body_that_is_not_args_kwargs_embed_is_refused(body: Any) -> None:
    message = SimpleNamespace(payload=body)

    with pytest.raises(InvalidTaskError, match=r"message body is not \[args, kwargs, embed\]"):
        ValidatedRequest(message, app=app, task=app.tasks[TASK_NAME])


def test_a_celery_message_is_taken_with_its_request() -> None:
    body = request("read_file", {"path": "a.txt"})
    message = TaskMessage(TASK_NAME, args=[body])

    taken = ValidatedRequest(message, app=app, task=app.tasks[TASK_NAME])

    assert taken.task_name == TASK_NAME
    assert taken.args == [body]


def test_the_queue_a_call_came_from_is_the_pool_it_runs_for(
    executor: Executor, client: fakeredis.FakeRedis, settings: WorkerSettings
) -> None:
    (Path(settings.workspace_root) / "run-1").mkdir()
    (Path(settings.workspace_root) / "run-1" / "a.txt").write_text("hello")

    tasks.execute_tool.apply(args=(request("read_file", {"path": "a.txt"}),), routing_key="tools")
    tasks.execute_tool.apply(args=(request("read_file", {"path": "a.txt"}),), routing_key="sandbox")

    served, refused = replies(client)
    assert served.output == "hello"
    assert refused.error_kind == "wrong_pool"
    assert "this worker serves 'sandbox'" in refused.output


@pytest.mark.parametrize(
    ("is_error", "kind", "duration_ms", "summary"),
    [
        (False, None, 3.21, "ok 3.2 ms"),
        (False, None, 1234.56, "ok 1235 ms"),
        (True, "timeout", 30012.4, "error timeout after 30012 ms"),
        (True, "invalid_arguments", 0.4, "error invalid_arguments after 0.4 ms"),
        (True, None, 2.0, "error tool_error after 2.0 ms"),
    ],
)
def test_monitors_are_told_the_outcome_in_a_few_words(
    is_error: bool, kind: Any, duration_ms: float, summary: str
) -> None:
    result = ToolCallResult(
        task_id="t",
        tool="write_file",
        output="secret file contents",
        is_error=is_error,
        error_kind=kind,
        duration_ms=duration_ms,
    )

    assert tasks.outcome_summary(result) == summary


def test_the_task_returns_the_outcome_and_fails_for_a_failed_call_once_it_is_answered(
    executor: Executor, client: fakeredis.FakeRedis, settings: WorkerSettings
) -> None:
    (Path(settings.workspace_root) / "run-1").mkdir()
    (Path(settings.workspace_root) / "run-1" / "a.txt").write_text("hello")

    served = tasks.execute_tool.apply(
        args=(request("read_file", {"path": "a.txt"}),), routing_key="tools"
    )
    failed = tasks.execute_tool.apply(
        args=(request("read_file", {"path": 7}),), routing_key="tools"
    )

    assert served.state == "SUCCESS"
    assert re.fullmatch(r"ok \d+\.\d ms", served.result)
    assert failed.state == "FAILURE"
    assert isinstance(failed.result, ToolCallFailed)
    assert re.fullmatch(r"error invalid_arguments after \d+\.\d ms", str(failed.result))
    # Answered before it failed, and the answer holds what the summary leaves out.
    ok, refused = replies(client)
    assert ok.output == "hello"
    assert refused.error_kind == "invalid_arguments"
    assert "'path'" in refused.output


def test_a_spare_message_of_a_call_started_elsewhere_succeeds_saying_it_did_not_run(
    executor: Executor, client: fakeredis.FakeRedis
) -> None:
    client.set(keys.started("spare"), start_mark(1, "other-worker:2"))
    body = request("write_file", {"path": "a.txt", "content": "x"}, task_id="spare")
    spare = tasks.execute_tool.apply(args=({**body, "send_number": 2},), routing_key="tools")
    assert spare.state == "SUCCESS"
    assert spare.result == "not run: the call is held by other-worker:2"
    assert replies(client) == []


def test_a_failed_call_is_an_expected_failure_that_is_never_retried() -> None:
    task = app.tasks[TASK_NAME]
    # Listed in `throws`: logged in one line, without a traceback, and acknowledged.
    assert ToolCallFailed in task.throws
    assert not issubclass(ToolCallFailed, tuple(task.autoretry_for))
    assert task.acks_late and task.acks_on_failure_or_timeout


def test_a_call_past_its_hard_limit_is_answered_as_timed_out(
    executor: Executor, client: fakeredis.FakeRedis
) -> None:
    body = request("read_file", {"path": "a.txt"}, task_id="stuck")

    tasks.execute_tool.on_failure(TimeLimitExceeded(7.5), "stuck", (body,), {}, None)
    tasks.execute_tool.on_failure(RuntimeError("other"), "stuck", (body,), {}, None)

    (answer,) = replies(client)
    assert answer.task_id == "stuck"
    assert answer.error_kind == "timeout"
    assert "hard time limit of 7.5 s" in answer.output


@pytest.mark.skipif(os.geteuid() != 0, reason="the sandbox user matters only to a root worker")
def test_a_new_process_starts_even_when_the_sandbox_cannot_sweep(
    settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    sandbox = settings.sandbox.model_copy(update={"user": "toolq-no-such-user", "uid_range": ""})
    broken = settings.model_copy(update={"sandbox": sandbox})
    monkeypatch.setattr(tasks, "get_worker_settings", lambda: broken)

    with caplog.at_level(logging.WARNING, logger="worker.tasks"):
        tasks._fresh_process()

    assert "cannot sweep orphaned commands" in caplog.text
    assert "'toolq-no-such-user' does not exist" in caplog.text
