"""A batch line's own ``limits``: one asking more than TOOLQ_LIMITS_MAX_* allows is a bad line
naming the field, refused before anything of it runs; a line within them runs with every call
of its run carrying them."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

from api.batch.input_scan import scan_input
from api.batch.items import BatchItem, ItemLimits
from api.batch.runner import run_item
from api.calls.dispatch import Dispatcher
from tests.api.batch.conftest import write_lines
from tests.api.batch.test_runner import FLEET, SETTINGS, FakeDispatcher, FakeModel, tool_then_answer
from worker.contract.run_limits import LimitsMax, RunLimits
from worker.contract.wire import ToolCallResult


def test_a_line_asking_more_than_the_maximums_is_a_bad_line_naming_limits(tmp_path: Path) -> None:
    path = tmp_path / "in.jsonl"
    write_lines(
        path,
        [
            {"id": "greedy", "prompt": "p", "limits": {"memory_mb": 999_999, "pids": 8}},
            {"id": "long", "prompt": "p", "limits": {"timeout_s": 100_000}},
            {"id": "typo", "prompt": "p", "limits": {"memory": 64}},
            {"id": "fine", "prompt": "p", "limits": {"memory_mb": 256, "pids": 32, "cpu": 0.5}},
        ],
    )

    scan = scan_input(path, {}, limits=ItemLimits(max_call_s=600, limits_max=LimitsMax()))

    reasons = {bad.number: bad.reason for bad in scan.bad_lines}
    assert reasons[1].startswith("limits: the run asks more than this fleet allows")
    assert "memory_mb=999999 (at most 4096)" in reasons[1] and "pids" not in reasons[1]
    assert "timeout_s=100000 (at most 600)" in reasons[2]
    assert reasons[3] == "unknown field 'limits.memory'"
    assert scan.pending == [4]
    assert [item.limits for item in scan.items()] == [RunLimits(memory_mb=256, pids=32, cpu=0.5)]


class _Request(SimpleNamespace):
    def model_copy(self, update: dict[str, Any]) -> _Request:
        return _Request(**{**vars(self), **update})


class LimitsSeen(FakeDispatcher):
    """Remembers the limits each call carried and what the run held while it ran."""

    def __init__(self) -> None:
        super().__init__()
        self.carried: list[tuple[RunLimits | None, RunLimits | None]] = []

    def build_request(self, spec: Any, **fields: Any) -> Any:
        return _Request(tool=spec.name, limits=None, **fields)

    async def call(self, request: Any, pool: str) -> ToolCallResult:
        self.carried.append((request.limits, self.limits.get(request.run_id)))
        return await super().call(request, pool)


async def test_a_line_within_the_maximums_runs_with_its_limits_on_every_call() -> None:
    asked = RunLimits(timeout_s=20, memory_mb=128, pids=16)
    dispatcher = LimitsSeen()

    record = await run_item(
        BatchItem(id="x", prompt="question", limits=asked),
        model=FakeModel(tool_then_answer),
        dispatcher=cast(Dispatcher, dispatcher),
        fleet=FLEET,
        settings=SETTINGS,
        run_id="b-12345678-x-abcdef",
    )

    assert record["status"] == "ok", record["error"]
    assert dispatcher.carried == [(asked, asked)]
    assert dispatcher.limits == {}  # let go when the run ended
