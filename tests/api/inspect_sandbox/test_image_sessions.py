"""bash_session in a run with an image: the shell runs in the run's container, as the image's
user, keeps its folder, variables and background processes between calls (the call's "kill
what it left running" step spares them and what they start, even in a session of its own),
takes Ctrl-C and restart, ends with the run, and no other run reaches it."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio

from api.inspect_sandbox import ToolqSandboxEnvironment
from api.runs.workspace import SESSION_TOOL, call_operation
from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS
from tests.conftest import WorkerFleet, until
from tests.worker.sessions.helpers import WAIT_MS, answer_of, processes_with, token
from worker.contract.wire import ToolCallResult
from worker.sandbox import SandboxConfig
from worker.sessions.holders import sessions_folder

pytestmark = [pytest.mark.integration, pytest.mark.asyncio(loop_scope="module"), INSPECT_WARNINGS]

TASK = f"image-sessions-{uuid.uuid4().hex[:6]}"


@pytest_asyncio.fixture(loop_scope="module", scope="module")
async def image_task(image_env: tuple[WorkerFleet, str]) -> AsyncIterator[str]:
    _, image = image_env
    await ToolqSandboxEnvironment.task_init(TASK, image)
    yield image
    await ToolqSandboxEnvironment.task_cleanup(TASK, image, True)


@pytest_asyncio.fixture(loop_scope="module")
async def box(image_task: str) -> AsyncIterator[ToolqSandboxEnvironment]:
    """A sample's sandbox: a run with a container of the image of its own."""
    environments = await ToolqSandboxEnvironment.sample_init(TASK, image_task, {})
    sandbox = environments["default"]
    assert isinstance(sandbox, ToolqSandboxEnvironment)
    yield sandbox
    await ToolqSandboxEnvironment.sample_cleanup(TASK, image_task, environments, False)


async def session_result(
    sandbox: ToolqSandboxEnvironment, action: str, text: str | None = None, **extra: Any
) -> ToolCallResult:
    workspace = sandbox.workspace
    spec = workspace._fleet.tools[SESSION_TOOL]
    arguments: dict[str, Any] = {"action": action, "timeout": WAIT_MS, **extra}
    if text is not None:
        arguments["input"] = text
    return await call_operation(
        workspace._dispatcher, spec, workspace.run_id, arguments, pool=spec.pool
    )


async def session(
    sandbox: ToolqSandboxEnvironment, action: str, text: str | None = None, **extra: Any
) -> dict[str, Any]:
    return answer_of(await session_result(sandbox, action, text, **extra))


async def test_the_shell_runs_in_the_container_and_keeps_its_state(
    box: ToolqSandboxEnvironment,
) -> None:
    made = await session(box, "type_submit", "mkdir -p sub && cd sub && export X=1")
    assert made["exit_code"] == 0 and made["running"] is False, made

    # A call between (run_bash's kind) kills what it leaves running, not the session's.
    other = await box.exec(["sh", "-c", "echo between"])
    assert other.stdout == "between\n"

    answer = await session(box, "type_submit", "pwd; echo X=$X; grep NAME /etc/os-release; id")
    commands_user = (await box.exec(["id"])).stdout.strip()
    assert answer["output"].splitlines() == [
        "/workspace/sub",
        "X=1",
        'NAME="toolq-full"',
        commands_user,
    ], answer
    assert answer["exit_code"] == 0


async def test_a_background_server_answers_in_the_next_call_after_a_command_between(
    box: ToolqSandboxEnvironment,
) -> None:
    started = await session(
        box, "type_submit", "mkdir -p www && echo served > www/index.html && "
        "httpd -f -p 127.0.0.1:8123 -h www &",
    )  # fmt: skip
    assert started["exit_code"] == 0, started
    await box.exec(["sh", "-c", "true"])

    answer = await session(
        box,
        "type_submit",
        "for i in $(seq 50); do wget -q -O - http://127.0.0.1:8123/ && break; sleep 0.1; done",
    )
    assert "served" in answer["output"], answer


async def test_ctrl_c_and_restart_end_what_runs(box: ToolqSandboxEnvironment) -> None:
    mark = token()
    still = await session(box, "type_submit", f"sleep {mark}", timeout=500)
    assert still["running"] is True, still
    # The shell may not have started it yet on a busy machine: it is still at it.
    await until(lambda: bool(processes_with(f"sleep {mark}")), f"sleep {mark} to start")

    stopped = await session(box, "interrupt")
    assert stopped["running"] is False and stopped["exit_code"] == 130, stopped
    assert not processes_with(f"sleep {mark}")

    await session(box, "type_submit", f"cd / && sleep {mark} &")
    restarted = await session(box, "restart")
    assert restarted["running"] is False and "new shell" in restarted["notice"]
    assert not processes_with(f"sleep {mark}")
    fresh = await session(box, "type_submit", "pwd")
    assert fresh["output"].splitlines() == ["/workspace"]


async def test_what_a_session_starts_in_a_session_of_its_own_stays_until_restart(
    box: ToolqSandboxEnvironment,
) -> None:
    """As Inspect's tools server keeps its shells (each a ``setsid`` child of the server); a
    plain call's own ``setsid`` daemon is still killed."""
    kept, left = token(), token()
    started = await session(
        box,
        "type_submit",
        f"sh -c 'setsid sleep {kept} & wait' & "
        f"until ps -o args | grep -q '^sleep {kept}'; do sleep 0.05; done; echo up",
    )
    assert started["output"].splitlines()[-1] == "up", started

    await box.exec(["sh", "-c", f"setsid sleep {left} & echo left"])

    assert processes_with(f"sleep {kept}") and not processes_with(f"sleep {left}")
    await session(box, "restart")
    await until(lambda: not processes_with(f"sleep {kept}"), "the restart to end it", 10)


async def test_the_session_ends_with_its_run(image_task: str) -> None:
    environments = await ToolqSandboxEnvironment.sample_init(TASK, image_task, {})
    sandbox = environments["default"]
    assert isinstance(sandbox, ToolqSandboxEnvironment)
    mark = token()
    await session(sandbox, "type_submit", f"sleep {mark} &")
    # The prompt may come back before the background job's shell has become sleep.
    await until(lambda: bool(processes_with(f"sleep {mark}")), f"sleep {mark} to start")

    await ToolqSandboxEnvironment.sample_cleanup(TASK, image_task, environments, False)

    assert not processes_with(f"sleep {mark}")


async def test_another_run_reaches_neither_the_socket_nor_the_processes(
    image_env: tuple[WorkerFleet, str], image_task: str, box: ToolqSandboxEnvironment
) -> None:
    workers, _ = image_env
    mark = token()
    await session(box, "type_submit", f"echo secret > /tmp/mine; sleep {mark} &")
    await until(lambda: bool(processes_with(f"sleep {mark}")), f"sleep {mark} to start")
    [victim] = processes_with(f"sleep {mark}")
    sessions = sessions_folder(SandboxConfig.from_settings(workers.settings))

    environments = await ToolqSandboxEnvironment.sample_init(TASK, image_task, {})
    try:
        attacker = environments["default"]
        assert isinstance(attacker, ToolqSandboxEnvironment)
        probe = await session(
            attacker,
            "type_submit",
            f"ls {sessions}; cat /tmp/mine; kill -9 {victim}; ps -o args | grep -c '^sleep'",
        )
        assert "secret" not in probe["output"], probe
        assert probe["output"].splitlines()[-1] == "0", probe  # it sees no sleep
    finally:
        await ToolqSandboxEnvironment.sample_cleanup(TASK, image_task, environments, False)

    assert processes_with(f"sleep {mark}") == [victim]
    kept = await session(box, "type_submit", "cat /tmp/mine")
    assert kept["output"].splitlines() == ["secret"]
