"""A tool that raises is logged with its call's ids (a path it refuses, in one line); a tool
past its deadline is answered as timed out at the deadline, whether it is a coroutine or a
plain function."""

from __future__ import annotations

import asyncio
import logging
import threading
import time

import pytest

from worker.exceptions import PathNotFoundError
from worker.plumbing.log_context import log_context
from worker.tools.functions import tool
from worker.tools.registry import ToolRegistry

SECRET = "canary-argument-0c41"


@tool
def explode(payload: str) -> str:
    """Raises whatever it is given.

    Args:
        payload: Text the tool never shows.
    """
    raise RuntimeError("disk on fire")


async def test_a_raising_tool_is_logged_with_its_ids_and_traceback_not_its_arguments(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = ToolRegistry()
    registry.register(explode)

    with (
        caplog.at_level(logging.WARNING, logger="worker.tools.registry"),
        log_context(run_id="run-7", tool_call_id="call_9"),
    ):
        answer = await registry.run("explode", {"payload": SECRET})

    assert answer.output == "Error executing explode: disk on fire"
    assert answer.error_kind == "tool_error"
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert (record.run_id, record.tool_call_id, record.tool) == ("run-7", "call_9", "explode")  # type: ignore[attr-defined]
    assert "explode" in record.getMessage()
    assert record.exc_info is not None
    assert 'raise RuntimeError("disk on fire")' in caplog.text  # the traceback
    assert SECRET not in caplog.text


@tool
def open_missing(path: str) -> str:
    """Refuses the path it is given, as the file tools refuse a path they cannot use.

    Args:
        path: A path in the workspace.
    """
    raise PathNotFoundError(f"{path!r} does not exist")


async def test_a_path_a_tool_refuses_is_told_to_the_model_and_logged_in_one_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    registry = ToolRegistry()
    registry.register(open_missing)

    with (
        caplog.at_level(logging.INFO, logger="worker.tools.registry"),
        log_context(run_id="run-7", tool_call_id="call_9"),
    ):
        answer = await registry.run("open_missing", {"path": SECRET})

    assert answer.output == f"Error executing open_missing: {SECRET!r} does not exist"
    assert answer.error_kind == "tool_error"
    [record] = caplog.records
    assert record.levelno == logging.INFO and record.exc_info is None
    assert record.getMessage() == "tool open_missing refused a path: PathNotFoundError"
    assert SECRET not in caplog.text


class Gate:
    """Holds a plain-function tool until the test lets it go."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.finished = threading.Event()

    def wait(self) -> str:
        self.release.wait(30)
        self.finished.set()
        return "too late"


async def test_a_plain_function_past_its_deadline_is_answered_then_and_left_to_finish() -> None:
    gate = Gate()
    registry = ToolRegistry()
    registry.register_function(gate.wait, name="stuck", description="Waits for the gate.")

    started = time.monotonic()
    answer = await registry.run("stuck", {}, timeout_ms=300)
    elapsed = time.monotonic() - started

    assert answer.output == "Error: stuck timed out after 300 ms and was stopped."
    assert answer.error_kind == "timeout"
    assert elapsed >= 0.3
    # Answered while the tool still waits at its gate (for 30 s): its thread runs on, nobody
    # waited for it, however slow the machine.
    assert not gate.finished.is_set()
    gate.release.set()
    assert await asyncio.to_thread(gate.finished.wait, 10)


async def test_a_coroutine_past_its_deadline_is_cancelled() -> None:
    cancelled = asyncio.Event()

    @tool
    async def dawdle() -> str:
        """Sleeps for a minute."""
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "never"

    registry = ToolRegistry()
    registry.register(dawdle)

    answer = await registry.run("dawdle", {}, timeout_ms=200)

    assert answer.error_kind == "timeout"
    assert "dawdle timed out after 200 ms" in answer.output
    assert cancelled.is_set()


async def test_within_its_deadline_a_tool_answers_and_its_own_timeout_error_is_its_error() -> None:
    def quick() -> str:
        return "done"

    def gives_up() -> str:
        raise TimeoutError("the upstream service did not answer")

    registry = ToolRegistry()
    registry.register_function(quick, name="quick", description="Answers at once.")
    registry.register_function(gives_up, name="gives_up", description="Times out on its own.")

    assert (await registry.run("quick", {}, timeout_ms=5000)).output == "done"
    own = await registry.run("gives_up", {}, timeout_ms=5000)
    assert own.error_kind == "tool_error"
    assert own.output == "Error executing gives_up: the upstream service did not answer"
