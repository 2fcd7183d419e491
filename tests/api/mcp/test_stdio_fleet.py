"""Which fleet ``toolq mcp`` serves, as an MCP client starts it: the official SDK passes the
server only HOME, PATH, SHELL and TERM of its own environment, so a shell's TOOLQ_BROKER_URL
never reaches it; ``--broker`` does, and a line on stderr says which fleet it serves."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client

from api.mcp.stdio import served_fleet
from api.settings import OrchestratorSettings
from tests.api.mcp.conftest import TOOLQ, mcp_refused
from tests.conftest import WorkerFleet

pytestmark = pytest.mark.integration


def broker_of(fleet: WorkerFleet) -> str:
    url = fleet.settings.broker_url
    assert url is not None
    return url


async def test_a_client_without_the_shells_variables_reaches_the_fleet_named_by_broker(
    fleet: WorkerFleet, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # What a user's shell holds: the SDK drops it, or the test would say nothing.
    monkeypatch.setenv("TOOLQ_BROKER_URL", "redis://127.0.0.1:1/0")
    assert not any(name.startswith("TOOLQ_") for name in get_default_environment())
    params = StdioServerParameters(command=TOOLQ, args=["mcp", "--broker", broker_of(fleet)])
    stderr = tmp_path / "stderr"
    with stderr.open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as session:
            written = await session.call_tool("write_file", {"path": "b.txt", "content": "fleet"})
            assert not written.is_error, written.content
            run_id = (written.meta or {}).get("toolq/run_id")
            assert isinstance(run_id, str)
            # Written by the fleet's workers, in their workspaces: no local stack of its own.
            workspace = Path(fleet.settings.workspace_root) / run_id
            assert (workspace / "b.txt").read_text() == "fleet"
    said = stderr.read_text().splitlines()
    assert said[0] == f"toolq mcp: serving the fleet at {broker_of(fleet)}", said


def test_a_broker_that_does_not_answer_is_one_line_before_serving() -> None:
    done = mcp_refused(
        ["--broker", "redis://:hunter2@127.0.0.1:1/0"], env={"PATH": os.environ["PATH"]}
    )
    assert done.returncode == 1
    assert done.stdout == ""
    [line] = done.stderr.splitlines()
    assert line.startswith("error: cannot connect to the broker at redis://:**@127.0.0.1:1/0")
    assert "hunter2" not in done.stderr


def test_a_broker_url_toolq_cannot_use_is_refused_as_the_variable_is() -> None:
    done = mcp_refused(["--broker", "http://127.0.0.1:6379"], env={"PATH": os.environ["PATH"]})
    assert done.returncode == 2
    assert done.stderr.startswith("error: TOOLQ_BROKER_URL")
    assert len(done.stderr.splitlines()) == 1


def test_the_line_hides_the_brokers_password_or_says_the_stack_is_its_own() -> None:
    fleet = served_fleet(OrchestratorSettings(broker_url="redis://:hunter2@10.0.0.5:6379/0"))
    assert fleet == "the fleet at redis://:**@10.0.0.5:6379/0"
    local = served_fleet(OrchestratorSettings(broker_url=None))
    assert local.startswith("a local stack of its own")
