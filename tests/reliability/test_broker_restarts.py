"""Redis killed and started again, as the deploy runs it (append-only), again and again while
run_bash calls with short deadlines are in flight: every call is answered, none runs twice."""

from __future__ import annotations

import asyncio
import collections
import uuid
from pathlib import Path

import pytest

from api.calls.dispatch import Dispatcher
from tests.conftest import Caller, until
from tests.reliability.conftest import start_stack
from worker.contract.wire import ToolCallResult

pytestmark = pytest.mark.integration

RESTARTS = 5
CALLS_PER_RESTART = 12
#: What run_bash may take: its call's deadline is this plus the grace and the reply margin.
COMMAND_LIMIT_MS = 4_000
#: Answers that say the call was lost: it never ran and nobody will run it.
LOST = ("no_answer", "broker_unavailable")


def _runs(ran: Path) -> collections.Counter[str]:
    """How many times each call's command ran, from the line each run appends."""
    return collections.Counter(ran.read_text().split()) if ran.exists() else collections.Counter()


async def test_calls_in_flight_through_repeated_redis_crashes_are_all_answered_once(
    tmp_path: Path,
) -> None:
    stack = start_stack(
        tmp_path / "stack",
        redis_appendonly=True,
        hard_limit_grace_s=1.0,
        # The deploy's margin past a call's limit (its default): time for a worker whose
        # connection dropped to take calls again.
        reply_margin_s=10.0,
        resend_after_s=1.0,
    )
    try:
        settings = stack.settings
        run_id = f"restarts-{uuid.uuid4().hex[:8]}"
        ran = stack.workspace_root / run_id / "ran.log"
        async with Dispatcher(settings) as dispatcher:
            caller = Caller(dispatcher, settings, run_id)
            warm = await caller("run_bash", {"command": "true"})
            assert not warm.is_error, warm.output

            async def marked_call(name: str) -> tuple[str, ToolCallResult]:
                command = f"echo {name} >> ran.log; sleep 0.3"
                arguments = {"command": command, "timeout": COMMAND_LIMIT_MS}
                return name, await caller("run_bash", arguments)

            calls: list[asyncio.Task[tuple[str, ToolCallResult]]] = []
            for restart in range(RESTARTS):
                names = [f"r{restart}c{n}" for n in range(CALLS_PER_RESTART)]
                calls += [asyncio.create_task(marked_call(name)) for name in names]
                # Killed with calls of this round run, running and still queued.
                await until(
                    lambda names=names: sum(_runs(ran)[n] for n in names) >= 2,  # type: ignore[misc]
                    "two calls of the round to run",
                )
                stack.redis.stop()
                stack.redis.start()
            answers = dict(await asyncio.gather(*calls))
        sandbox_log = "\n".join(
            line for line in stack.fleet.log("sandbox", 2000).splitlines() if line.startswith("[")
        )
    finally:
        stack.stop()

    runs = _runs(ran)
    lost = {name: r.output for name, r in answers.items() if r.error_kind in LOST}
    twice = {name: n for name, n in runs.items() if n > 1}
    assert len(answers) == RESTARTS * CALLS_PER_RESTART
    assert lost == {}, (
        f"{len(lost)} calls lost to the restarts: {list(lost)}, e.g. {next(iter(lost.values()))}; "
        f"the sandbox worker's log:\n{sandbox_log[-8000:]}"
    )
    assert twice == {}, f"calls run more than once: {twice}"
    # No call is answered ok that never ran.
    said_ok_unrun = [n for n, r in answers.items() if not r.is_error and runs[n] == 0]
    assert said_ok_unrun == []
