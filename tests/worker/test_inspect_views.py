"""What Celery's own monitoring commands show of a call in flight, run for real (`celery inspect`
against a real worker): the tool and the run, never the call's arguments, its ``env`` values, the
conversation it carries, or anything that seals its answer."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.local.stack import worker_environment
from tests.conftest import WorkerFleet, orchestrator_settings, tool_spec, until
from worker.contract.fleet_secret import fleet_secret
from worker.contract.keys import keys
from worker.contract.wire import ToolContextSnapshot

pytestmark = pytest.mark.integration

COMMAND_MARK = "command-value-5e1f"
ENV_VALUE = "env-value-9c2d-hunter2"
PROMPT_MARK = "system-prompt-7a3b"


def inspect(fleet: WorkerFleet, *command: str) -> str:
    """``celery -A worker.app inspect <command>``, as an operator runs it on the fleet."""
    argv = [sys.executable, "-m", "celery", "-A", "worker.app", "inspect", *command]
    env = {**os.environ, **worker_environment(fleet.settings)}
    done = subprocess.run(
        [*argv, "--timeout", "5", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.stdout + done.stderr


async def test_celery_inspect_shows_no_argument_env_value_or_secret_of_a_running_call(
    fleet: WorkerFleet,
) -> None:
    client = redis.Redis.from_url(fleet.settings.redis_url)
    settings = orchestrator_settings(fleet.settings)
    secret = fleet_secret(settings.fleet_secret_file)
    run_id = f"inspected-{uuid.uuid4().hex[:8]}"
    gate = Path(fleet.settings.workspace_root) / run_id / "gate"
    async with Dispatcher(settings) as dispatcher:
        request = dispatcher.build_request(
            tool_spec("run_bash", pool="sandbox", default_timeout_ms=20_000),
            task_id=f"inspected-{uuid.uuid4().hex}",
            run_id=run_id,
            arguments={
                "command": f"echo {COMMAND_MARK} >/dev/null; "
                "while [ ! -e gate ]; do sleep 0.05; done; echo opened",
                "env": {"API_TOKEN": ENV_VALUE},
            },
            context=ToolContextSnapshot(system_prompt=PROMPT_MARK),
        )
        pending = asyncio.create_task(dispatcher.call(request, "sandbox"))
        try:
            await until(
                lambda: bool(client.exists(keys.started(request.task_id))), "the call to run"
            )
            # At once: each waits its 5 s for replies, and the call (20 s at most on this
            # fleet) must still run when the last one asks.
            commands = [("active",), ("reserved",), ("query_task", request.task_id)]
            outputs = await asyncio.gather(
                *(asyncio.to_thread(inspect, fleet, *command) for command in commands)
            )
            shown = dict(zip(commands, outputs, strict=True))
        finally:
            gate.touch()
        answer = await asyncio.wait_for(pending, 60)

    assert "opened" in answer.output
    assert request.task_id in shown[("active",)], shown[("active",)]
    assert "run_bash" in shown[("active",)] and run_id in shown[("active",)]
    assert request.task_id in shown[("query_task", request.task_id)]
    for output in shown.values():
        for kept in (
            COMMAND_MARK,
            ENV_VALUE,
            PROMPT_MARK,
            secret.seal_key(request.task_id),
            secret.value.decode(),
        ):
            assert kept not in output, output
    client.close()
