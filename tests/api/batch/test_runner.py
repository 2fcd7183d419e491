"""Running a batch's items without processes: run ids, one conversation's record, the bound on
conversations in flight, and resuming a stopped batch."""

from __future__ import annotations

import asyncio
import json
import os
import re
import socket
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest

from api.batch.input_scan import scan_input
from api.batch.items import BatchItem
from api.batch.record import BatchRecord
from api.batch.results import ResultLog
from api.batch.runner import run_item, run_items
from api.batch.tag import batch_run_id, batch_tag_for_output
from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.exceptions import ModelError
from api.model.client import ChatModel, ModelToolCall, ModelTurn, RetryPolicy, Usage
from api.process.logs import current_context
from api.settings import OrchestratorSettings
from tests.api.batch.conftest import record, write_lines
from worker.contract.wire import RUN_ID_PATTERN, ToolCallResult, ToolSpec, WorkerInfo

# --- Run ids -------------------------------------------------------------------------------------


def test_run_ids_are_valid_stable_and_distinct(tmp_path: Path) -> None:
    key = batch_tag_for_output(tmp_path / "out.jsonl")
    ids = ["a b", "a/b", "a_b", "ünï", "../../etc", "x" * 500, "."]
    run_ids = [batch_run_id(key, item_id) for item_id in ids]
    assert all(re.fullmatch(RUN_ID_PATTERN, run_id) for run_id in run_ids)
    assert len(set(run_ids)) == len(ids)
    assert all("/" not in run_id for run_id in run_ids)
    assert batch_run_id(key, "a b") == run_ids[0]
    assert batch_run_id(batch_tag_for_output(tmp_path / "other.jsonl"), "a b") != run_ids[0]
    assert run_ids[0].startswith(f"b-{key}-a_b-")


def test_the_batch_tag_follows_the_file_not_the_spelling(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    assert batch_tag_for_output(Path("out.jsonl")) == batch_tag_for_output(tmp_path / "out.jsonl")


# --- One conversation ----------------------------------------------------------------------------


#: A complete record: every field of a result line, none besides.
RECORD_KEYS = set(BatchRecord.model_fields)


class FakeModel(ChatModel):
    """Answers each turn with ``turns(messages)``; remembers the model names asked for."""

    def __init__(self, turns: Callable[[list[dict[str, Any]]], ModelTurn]) -> None:
        self.policy = RetryPolicy()
        self._turns = turns
        self.models: list[str] = []
        self.contexts: list[dict[str, str]] = []

    async def complete(
        self,
        *,
        model: str,
        messages: Sequence[Any],
        tools: Sequence[Any] | None = None,
    ) -> ModelTurn:
        self.models.append(model)
        self.contexts.append(current_context())
        return self._turns([dict(m) for m in messages])


class FakeDispatcher:
    """Answers every remote call at once, as worker fake:1 would."""

    def __init__(self) -> None:
        #: A run's network and limits, as ``Dispatcher`` holds them.
        self.networks: dict[str, Any] = {}
        self.limits: dict[str, Any] = {}

    def build_request(self, spec: ToolSpec, **fields: Any) -> Any:
        return SimpleNamespace(tool=spec.name, **fields)

    async def call(self, request: Any, pool: str) -> ToolCallResult:
        return ToolCallResult(
            task_id=request.task_id,
            tool=request.tool,
            output=f"echo {request.arguments}",
            duration_ms=1.5,
            worker="fake:1",
        )


ECHO = ToolSpec(
    name="echo",
    description="Says it back.",
    parameters={"type": "object", "properties": {}},
    pool="tools",
    enabled_by_default=True,
    idempotent=True,
    default_timeout_ms=1000,
)


FAKE_WORKER = WorkerInfo(worker="tools@fake", pools=["tools"], host="fake", pid=1, started=0)


FLEET = Fleet(tools={"echo": ECHO}, workers={"tools": [FAKE_WORKER], "sandbox": []})


SETTINGS = OrchestratorSettings(
    broker_url="redis://127.0.0.1:1/0", model="settings-model", max_turns=7
)


def tool_then_answer(messages: list[dict[str, Any]]) -> ModelTurn:
    """First an echo call and a call of a tool nobody serves, then an answer."""
    if not any(m["role"] == "assistant" for m in messages):
        return ModelTurn(
            content=None,
            tool_calls=[
                ModelToolCall("c1", "echo", '{"text": "hi"}'),
                ModelToolCall("c2", "nonexistent", "{}"),
            ],
            usage=Usage(10, 2, 12),
        )
    return ModelTurn(content=f"answer to {messages[1]['content']}", usage=Usage(20, 3, 23))


async def run(
    item: BatchItem, model: ChatModel, default_model: str | None = None, **options: Any
) -> dict[str, Any]:
    return await run_item(
        item,
        model=model,
        dispatcher=cast(Dispatcher, FakeDispatcher()),
        fleet=FLEET,
        settings=SETTINGS,
        run_id="b-12345678-x-abcdef",
        default_model=default_model,
        **options,
    )


async def test_a_finished_conversation_is_one_complete_record() -> None:
    result = await run(BatchItem(id="x", prompt="question"), FakeModel(tool_then_answer))
    assert set(result) == RECORD_KEYS
    assert result["id"] == "x"
    assert result["status"] == "ok"
    assert result["error"] is None
    assert result["answer"] == "answer to question"
    assert result["stop_reason"] == "answered"
    assert result["run_id"] == "b-12345678-x-abcdef"
    assert result["usage"] == {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35}
    assert result["duration_s"] >= 0
    assert (result["attempts"], result["earlier_run_ids"]) == (1, [])
    assert result["orchestrator"] == f"{socket.gethostname()}:{os.getpid()}"
    echo, unknown = result["tool_calls"]
    assert (echo["name"], echo["worker"], echo["is_error"], echo["error_kind"]) == (
        "echo",
        "fake:1",
        False,
        None,
    )
    assert echo["id"] == "c1"
    assert echo["arguments"] == '{"text": "hi"}'
    assert echo["output"].startswith("echo")
    assert echo["duration_ms"] == 1.5
    assert (unknown["name"], unknown["is_error"], unknown["error_kind"]) == (
        "nonexistent",
        True,
        "unknown_tool",
    )
    assert [m["role"] for m in result["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "tool",
        "assistant",
    ]
    json.dumps(result)  # the record is plain JSON data


async def test_the_item_model_wins_over_the_default_which_wins_over_settings() -> None:
    model = FakeModel(tool_then_answer)
    await run(BatchItem(id="a", prompt="p", model="item-model"), model, "default-model")
    await run(BatchItem(id="b", prompt="p"), model, "default-model")
    await run(BatchItem(id="c", prompt="p"), model)
    assert model.models[::2] == ["item-model", "default-model", "settings-model"]


async def test_turn_limit_and_system_prompt_come_from_the_item() -> None:
    def never_answers(messages: list[dict[str, Any]]) -> ModelTurn:
        return ModelTurn(content=None, tool_calls=[ModelToolCall("c", "echo", "{}")])

    item = BatchItem(id="a", prompt="p", max_turns=2, system_prompt="Be terse.")
    result = await run(item, FakeModel(never_answers))
    assert result["status"] == "ok"
    assert result["stop_reason"] == "max_turns"
    assert len(result["tool_calls"]) == 2
    assert result["messages"][0] == {"role": "system", "content": "Be terse."}

    unlimited = await run(BatchItem(id="b", prompt="p"), FakeModel(never_answers))
    assert len(unlimited["tool_calls"]) == SETTINGS.max_turns


async def test_a_model_error_is_an_error_record_with_the_conversation_so_far() -> None:
    def fails_second(messages: list[dict[str, Any]]) -> ModelTurn:
        if any(m["role"] == "assistant" for m in messages):
            raise ModelError("model request failed after 5 attempts: HTTP 503", attempts=5)
        return tool_then_answer(messages)

    result = await run(BatchItem(id="x", prompt="p"), FakeModel(fails_second))
    assert set(result) == RECORD_KEYS
    assert result["status"] == "error"
    assert result["answer"] is None
    assert result["error"] == "model request failed after 5 attempts: HTTP 503"
    assert len(result["tool_calls"]) == 2
    json.dumps(result)


class SlowModel(FakeModel):
    """Takes ``seconds`` over each turn after the first."""

    def __init__(self, seconds: float) -> None:
        super().__init__(tool_then_answer)
        self.seconds = seconds

    async def complete(self, **request: Any) -> ModelTurn:
        if any(m["role"] == "assistant" for m in request["messages"]):
            await asyncio.sleep(self.seconds)
        return await super().complete(**request)


async def test_a_conversation_past_its_time_limit_is_an_error_record_with_what_it_did() -> None:
    earlier = ["b-12345678-x-0a1b2c"]  # the workspace of the attempt a stop cut
    result = await run(
        BatchItem(id="x", prompt="p"),
        SlowModel(30),
        timeout_s=0.2,
        attempt=2,
        earlier_run_ids=earlier,
    )
    assert set(result) == RECORD_KEYS
    assert result["status"] == "error"
    assert result["error"] == (
        "the conversation did not finish within 0.2 s (TOOLQ_CONVERSATION_TIMEOUT_S)"
    )
    assert len(result["tool_calls"]) == 2  # the first turn's calls, made before the limit
    assert (result["attempts"], result["earlier_run_ids"]) == (2, earlier)
    assert result["duration_s"] < 30  # cut at its limit, not waited out


async def test_a_timeout_inside_the_conversation_is_not_taken_for_its_time_limit() -> None:
    def times_out(messages: list[dict[str, Any]]) -> ModelTurn:
        raise TimeoutError("a socket timed out")

    result = await run(BatchItem(id="x", prompt="p"), FakeModel(times_out), timeout_s=30)
    assert result["error"] == "unexpected TimeoutError: a socket timed out"


async def test_a_time_limit_that_is_not_reached_changes_nothing() -> None:
    result = await run(BatchItem(id="x", prompt="p"), SlowModel(0.01), timeout_s=30)
    assert result["status"] == "ok"
    assert result["answer"] == "answer to p"


async def test_an_unexpected_exception_is_an_error_record_too() -> None:
    def broken(messages: list[dict[str, Any]]) -> ModelTurn:
        raise KeyError("choices")

    result = await run(BatchItem(id="x", prompt="p"), FakeModel(broken))
    assert result["status"] == "error"
    assert result["error"] == "unexpected KeyError: 'choices'"


async def test_enabling_a_tool_the_fleet_lacks_fails_only_that_item() -> None:
    result = await run(
        BatchItem(id="x", prompt="p", enable=["teleport"]), FakeModel(tool_then_answer)
    )
    assert result["status"] == "error"
    assert "'teleport'" in result["error"]
    assert result["messages"] == []
    assert result["tool_calls"] == []
    assert result["model"] == "settings-model"


async def test_the_conversation_runs_under_its_run_id_in_the_logs() -> None:
    model = FakeModel(tool_then_answer)
    await run(BatchItem(id="x", prompt="p"), model)
    assert model.contexts == [{"run_id": "b-12345678-x-abcdef"}] * 2
    assert current_context() == {}


# --- Many conversations --------------------------------------------------------------------------


def items(count: int) -> list[BatchItem]:
    return [BatchItem(id=str(n), prompt=f"p{n}") for n in range(count)]


class GatedRunner:
    """Holds every conversation until released; knows how many ran at once."""

    def __init__(self, expected_peak: int) -> None:
        self.in_flight = 0
        self.peak = 0
        self.started: list[str] = []
        self.cancelled: list[str] = []
        self.release = asyncio.Event()
        self.full = asyncio.Event()
        self._expected_peak = expected_peak

    async def __call__(self, item: BatchItem) -> dict[str, Any]:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        self.started.append(item.id)
        if self.in_flight == self._expected_peak:
            self.full.set()
        try:
            await self.release.wait()  # bound: the test cancels the batch or sets release
        except asyncio.CancelledError:
            self.cancelled.append(item.id)
            raise
        finally:
            self.in_flight -= 1
        return {"id": item.id, "status": "ok"}


async def fill(
    count: int, concurrency: int
) -> tuple[GatedRunner, list[dict[str, Any]], asyncio.Task[None]]:
    """A batch of ``count`` items held at the gate once ``concurrency`` of them are in flight."""
    runner = GatedRunner(expected_peak=concurrency)
    results: list[dict[str, Any]] = []
    task = asyncio.create_task(
        run_items(items(count), concurrency=concurrency, runner=runner, on_result=results.append)
    )
    await asyncio.wait_for(runner.full.wait(), 5)
    return runner, results, task


async def test_exactly_concurrency_conversations_are_in_flight() -> None:
    runner, results, task = await fill(13, concurrency=4)
    for _ in range(5):  # give a fifth conversation every chance to start
        await asyncio.sleep(0)
    assert runner.in_flight == 4
    assert len(asyncio.all_tasks()) <= 4 + 2  # workers, this test, run_items: not a task per item
    runner.release.set()
    await asyncio.wait_for(task, 5)
    assert runner.peak == 4
    assert sorted(int(r["id"]) for r in results) == list(range(13))


async def test_an_async_result_handler_works_too() -> None:
    async def runner(item: BatchItem) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"id": item.id}

    seen: list[str] = []

    async def on_result(result: dict[str, Any]) -> None:
        await asyncio.sleep(0)
        seen.append(result["id"])

    await run_items(items(20), concurrency=3, runner=runner, on_result=on_result)
    assert sorted(seen, key=int) == [str(n) for n in range(20)]


async def test_cancelling_the_batch_cancels_conversations_in_flight_and_keeps_results() -> None:
    runner, results, task = await fill(10, concurrency=3)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert sorted(runner.cancelled) == ["0", "1", "2"]
    assert results == []
    assert runner.started == ["0", "1", "2"]


async def test_a_failing_result_handler_stops_the_batch_with_its_error() -> None:
    runner = GatedRunner(expected_peak=99)
    runner.release.set()

    def on_result(result: dict[str, Any]) -> None:
        raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        await run_items(items(10), concurrency=2, runner=runner, on_result=on_result)
    assert runner.in_flight == 0


async def test_concurrency_below_one_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        await run_items([], concurrency=0, runner=GatedRunner(1), on_result=print)


# --- Resume --------------------------------------------------------------------------------------


async def test_a_stopped_batch_resumes_without_rerunning_what_finished(tmp_path: Path) -> None:
    source = write_lines(tmp_path / "in.jsonl", [{"id": f"i{n}", "prompt": "p"} for n in range(12)])
    out = tmp_path / "out.jsonl"
    runs: list[str] = []
    enough = asyncio.Event()

    async def runner(item: BatchItem) -> dict[str, Any]:
        runs.append(item.id)
        if enough.is_set():
            await asyncio.Event().wait()  # bound: in flight until the batch is stopped
        return record(item.id)

    with ResultLog.open(out) as results:

        def on_result(result: dict[str, Any]) -> None:
            results.append(result)
            if len(results.done) == 5:
                enough.set()

        scan = scan_input(source, results.done)
        first = asyncio.create_task(
            run_items(scan.items(), concurrency=3, runner=runner, on_result=on_result)
        )
        await asyncio.wait_for(enough.wait(), 5)
        first.cancel()
        with pytest.raises(asyncio.CancelledError):
            await first
    finished_first = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert len(finished_first) == 5
    with out.open("a") as torn:  # as if the kill had come in the middle of a write
        torn.write('{"id": "i11", "status": "o')

    runs.clear()
    enough.clear()
    with ResultLog.open(out) as results:
        assert set(results.done) == set(finished_first)
        scan = scan_input(source, results.done)
        assert scan.already_done == 5
        again = run_items(scan.items(), concurrency=3, runner=runner, on_result=results.append)
        await asyncio.wait_for(again, 5)
    assert not set(runs) & set(finished_first)
    finished = [json.loads(line)["id"] for line in out.read_text().splitlines()]
    assert sorted(finished) == sorted(f"i{n}" for n in range(12))
