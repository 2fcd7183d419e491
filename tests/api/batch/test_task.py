"""An item as a task, without processes: the order of its steps, its score, and what becomes of
it when a step fails or cannot run. The fleet's service operations are played by a fake that
keeps each run's files in memory and answers commands from a table; the real ones run in
tests/e2e/test_batch_tasks.py."""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any, cast

import pytest

from api.batch.items import BatchItem
from api.batch.runner import run_item
from api.batch.task import check_verdict, target_verdict
from api.calls.dispatch import Dispatcher
from api.calls.fleet import Fleet
from api.model.client import ChatModel, ModelTurn, RetryPolicy, Usage
from api.runs.workspace import CommandResult
from api.settings import OrchestratorSettings
from tests.conftest import tool_spec
from worker.contract.wire import ToolCallResult, ToolSpec, WorkerInfo
from worker.tools.service import encode_content

SERVICE = [
    tool_spec("toolq.remove_workspace", for_model=False),
    tool_spec("toolq.put_files", for_model=False),
    tool_spec("toolq.collect_files", for_model=False),
    tool_spec("toolq.exec", "sandbox", for_model=False, timeout_argument="timeout_ms"),
]
SETTINGS = OrchestratorSettings(broker_url="redis://127.0.0.1:1/0", max_timeout_ms=60_000)


def fleet(*pools: str) -> Fleet:
    tools: dict[str, ToolSpec] = {spec.name: spec for spec in SERVICE}
    workers = {
        pool: [WorkerInfo(worker=f"{pool}@f", pools=[pool], host="f", pid=1, started=0)]
        for pool in pools
    }
    return Fleet(tools=tools, workers=workers)


@dataclass
class FakeFleet:
    """Service operations on in-memory workspaces; commands answered from ``commands``."""

    commands: dict[str, dict[str, Any]] = field(default_factory=dict)
    files: dict[str, bytes] = field(default_factory=dict)
    calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    refuse: set[str] = field(default_factory=set)
    #: A run's network and limits, as ``Dispatcher`` holds them.
    networks: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)

    def build_request(self, spec: ToolSpec, **fields: Any) -> Any:
        return SimpleNamespace(tool=spec.name, **fields)

    async def call(self, request: Any, pool: str) -> ToolCallResult:
        operation, arguments = request.tool, request.arguments
        self.calls.append((operation, arguments))
        if operation in self.refuse:
            return ToolCallResult(
                task_id=request.task_id,
                tool=operation,
                output=f"Error executing {operation}: disk full",
                is_error=True,
                error_kind="tool_error",
            )
        answer: dict[str, Any] = {"ok": True}
        if operation == "toolq.remove_workspace":
            answer["removed"] = bool(self.files)
            self.files.clear()
        elif operation == "toolq.put_files":
            for path, content in arguments["files"].items():
                data = content.encode() if isinstance(content, str) else content["base64"]
                self.files[path] = data if isinstance(content, str) else base64.b64decode(data)
            answer["written"] = {path: len(self.files[path]) for path in arguments["files"]}
        elif operation == "toolq.collect_files":
            answer["files"] = {
                path: dict(zip(("content", "encoding"), encode_content(data), strict=True))
                | {"size": len(data), "truncated": False}
                for path, data in sorted(self.files.items())
            }
            answer["matched"] = len(self.files)
        else:
            ran = {"stdout": "", "stderr": "", "exit_code": 0, "timed_out": False}
            answer |= ran | {"duration_ms": 3} | self.commands.get(arguments["command"], {})
        return ToolCallResult(
            task_id=request.task_id, tool=operation, output=json.dumps(answer), worker="fake:1"
        )

    def ran(self, operation: str) -> list[dict[str, Any]]:
        return [arguments for name, arguments in self.calls if name == operation]


class Answers(ChatModel):
    """Answers every request with ``text``; counts the requests."""

    def __init__(self, text: str) -> None:
        self.policy = RetryPolicy()
        self.text = text
        self.requests = 0

    async def complete(
        self, *, model: str, messages: Sequence[Any], tools: Sequence[Any] | None = None
    ) -> ModelTurn:
        self.requests += 1
        return ModelTurn(content=self.text, usage=Usage(5, 5, 10))


async def run(
    item: BatchItem, fake: FakeFleet, model: ChatModel, pools: Sequence[str] = ("tools", "sandbox")
) -> dict[str, Any]:
    return await run_item(
        item,
        model=model,
        dispatcher=cast(Dispatcher, fake),
        fleet=fleet(*pools),
        settings=SETTINGS,
        run_id="b-1-t-2",
    )


def task(**fields: Any) -> BatchItem:
    return BatchItem.model_validate({"id": "t", "prompt": "go", **fields})


async def test_a_task_starts_afresh_with_its_files_then_setup_then_the_model_then_check() -> None:
    fake = FakeFleet(files={"left/over.txt": b"from an earlier attempt"})
    fake.commands["make ready"] = {"stdout": "ready"}
    fake.commands["grep -q 42 answer"] = {"stdout": "found 42\n"}
    model = Answers("It is 42.")
    item = task(
        files={"in.txt": "6*7", "bin": {"base64": "AP8="}},
        setup="make ready",
        check="grep -q 42 answer",
        artifacts=["**"],
        metadata={"split": "dev"},
    )
    result = await run(item, fake, model)

    assert result["status"] == "ok", result["error"]
    assert [name for name, _ in fake.calls] == [
        "toolq.remove_workspace",
        "toolq.put_files",
        "toolq.exec",
        "toolq.exec",
        "toolq.collect_files",
    ]
    setup, check = fake.ran("toolq.exec")
    assert (setup["command"], setup["timeout_ms"]) == ("make ready", 59_000)
    assert check["env"] == {"TOOLQ_ANSWER": "It is 42.", "TOOLQ_STOP_REASON": "answered"}
    assert check["input"] == "It is 42."
    assert fake.files == {"in.txt": b"6*7", "bin": b"\x00\xff"}
    assert result["setup"] == {
        "exit_code": 0,
        "duration_ms": 3,
        "stdout": "ready",
        "stderr": "",
        "timed_out": False,
    }
    assert result["score"] == {"passed": True, "method": "check", "explanation": "found 42\n"}
    assert sorted(result["artifacts"]) == ["bin", "in.txt"]
    assert result["artifacts_matched"] == 2
    assert result["metadata"] == {"split": "dev"}
    assert model.requests == 1


async def test_a_failing_setup_ends_the_item_before_the_model_is_asked() -> None:
    fake = FakeFleet()
    fake.commands["false"] = {"exit_code": 3, "stderr": "x" * 600 + "\nno such file\n"}
    model = Answers("never")
    result = await run(task(setup="false", check="true", artifacts=["*.log"]), fake, model)
    assert model.requests == 0
    assert result["status"] == "error"
    assert result["error"].startswith("setup failed: exit code 3: ...")
    assert result["error"].endswith("x\nno such file")
    assert len(result["error"]) < 600
    assert result["setup"]["exit_code"] == 3
    assert result["check"] is None and result["score"] is None
    assert result["artifacts"] == {}  # still collected: they may say what went wrong
    assert len(fake.ran("toolq.exec")) == 1


async def test_a_setup_that_times_out_says_so() -> None:
    fake = FakeFleet()
    fake.commands["sleep 99"] = {"exit_code": -1, "timed_out": True, "stderr": "killed"}
    result = await run(task(setup="sleep 99", setup_timeout_s=2), fake, Answers("never"))
    assert result["error"] == "setup failed: timed out after 2 s (exit code -1): killed"


@pytest.mark.parametrize(
    ("answer", "exit_code", "passed", "explanation"),
    [
        ("Paris", 0, True, "target: the answer contains 'paris'\ncheck: ok"),
        ("Paris", 1, False, "target: the answer contains 'paris'\ncheck: ok"),
        ("Lyon", 0, False, "target: the answer does not contain 'paris'\ncheck: ok"),
    ],
)
async def test_with_a_target_and_a_check_both_must_pass(
    answer: str, exit_code: int, passed: bool, explanation: str
) -> None:
    fake = FakeFleet(commands={"judge": {"exit_code": exit_code, "stdout": "ok"}})
    result = await run(task(target="  paris ", check="judge"), fake, Answers(answer))
    assert result["score"] == {"passed": passed, "method": "both", "explanation": explanation}
    assert result["status"] == "ok"


async def test_a_target_alone_needs_no_workspace() -> None:
    fake = FakeFleet()
    result = await run(task(target="PARIS"), fake, Answers("It is paris."), pools=())
    assert result["score"] == {
        "passed": True,
        "method": "target",
        "explanation": "the answer contains 'PARIS'",
    }
    assert fake.calls == []


async def test_a_check_without_a_sandbox_worker_leaves_the_score_null_and_says_why() -> None:
    fake = FakeFleet()
    result = await run(task(target="x", check="true"), fake, Answers("x"), pools=("tools",))
    assert result["status"] == "error"
    assert result["score"] is None
    assert result["error"] == "the check could not run: no live worker serves the sandbox pool"
    assert result["answer"] == "x"  # the conversation itself went well
    assert fake.ran("toolq.exec") == []


async def test_a_setup_without_a_sandbox_worker_asks_no_model() -> None:
    model = Answers("never")
    result = await run(task(setup="true"), FakeFleet(), model, pools=("tools",))
    assert result["error"] == (
        "setup failed: it could not run: no live worker serves the sandbox pool"
    )
    assert model.requests == 0


async def test_files_that_cannot_be_written_end_the_item() -> None:
    fake = FakeFleet(refuse={"toolq.put_files"})
    model = Answers("never")
    result = await run(task(files={"a": "b"}), fake, model)
    assert (
        result["error"]
        == "the files could not be written: Error executing toolq.put_files: disk full"
    )
    assert model.requests == 0


async def test_artifacts_that_cannot_be_collected_make_an_ok_item_an_error() -> None:
    fake = FakeFleet(refuse={"toolq.collect_files"})
    result = await run(task(artifacts=["*"]), fake, Answers("done"))
    assert result["status"] == "error"
    assert result["error"].startswith("the artifacts could not be collected: ")
    assert result["answer"] == "done"


def command(**fields: Any) -> CommandResult:
    values = {"stdout": "", "stderr": "", "exit_code": 0, "timed_out": False, "duration_ms": 1}
    return CommandResult.model_validate(values | fields)


def test_a_check_explains_itself_with_its_stdout_or_how_it_ended() -> None:
    assert check_verdict(command(stdout="3/3 tests passed\n"), 300) == (True, "3/3 tests passed\n")
    assert check_verdict(command(exit_code=2), 300) == (False, "the check exited with code 2")
    assert check_verdict(command(exit_code=2, stderr="grep: out.txt: No such file\n"), 300) == (
        False,
        "the check exited with code 2: grep: out.txt: No such file",
    )
    assert check_verdict(command(exit_code=-1, timed_out=True, stdout="1/3\n"), 9) == (
        False,
        "1/3\n\nthe check timed out after 9 s",
    )


def test_a_target_ignores_case_and_its_surrounding_whitespace() -> None:
    assert target_verdict("The answer is B.", " b. ")[0]
    assert target_verdict("Straße", "STRASSE")[0]  # full case folding
    assert not target_verdict("", "x")[0]


async def test_a_service_answer_that_is_not_json_costs_one_item_not_the_batch() -> None:
    class Garbled(FakeFleet):
        async def call(self, request: Any, pool: str) -> ToolCallResult:
            if request.tool == "toolq.collect_files":
                return ToolCallResult(task_id=request.task_id, tool=request.tool, output="{")
            return await super().call(request, pool)

    result = await run(task(artifacts=["*"]), Garbled(), Answers("done"))
    assert result["status"] == "error"
    assert result["error"].startswith("unexpected JSONDecodeError")
