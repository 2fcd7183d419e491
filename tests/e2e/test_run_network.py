"""A run's network as its users meet it, on a fleet whose operator allows lists: an Inspect eval
whose task's toolq.yaml lists one server, and the official MCP client against ``toolq mcp
--network``. Each reaches the listed server, in a network namespace of the test's own, and not
the one beside it, and is told in one line why not."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.scorer import CORRECT
from inspect_ai.tool import bash
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment, stdio_client

from tests.api.inspect_sandbox.conftest import fleet_of_its_own, fleet_variables
from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, run_eval, tool_messages
from tests.api.mcp.conftest import TOOLQ, mcp_refused
from tests.conftest import WorkerFleet
from tests.worker.netns_server import Served, free_port, served_in_namespace

pytestmark = [
    pytest.mark.integration,
    pytest.mark.netns,
    INSPECT_WARNINGS,
    pytest.mark.skipif(os.geteuid() != 0, reason="test namespaces and a run's network need root"),
]
CURL = "curl -s -S --max-time 20"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[Served, Served]]:
    with served_in_namespace((free_port(), free_port())) as ((listed, unlisted), _machine):
        yield listed, unlisted


@pytest.fixture(scope="module")
def network_fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WorkerFleet]:
    """A fleet of its own whose operator lets runs ask for any list."""
    with fleet_of_its_own(tmp_path_factory, network_allowed=["list"]) as workers:
        yield workers


def fetch_both(listed: Served, unlisted: Served) -> str:
    """A command that keeps the listed server's answer in answer.txt and tries the other."""
    return (
        f"{CURL} http://{listed.address}:{listed.port}/ > answer.txt; cat answer.txt; echo; "
        f"{CURL} -p http://{unlisted.address}:{unlisted.port}/"
    )


def test_an_inspect_task_reaches_what_its_sandbox_config_lists(
    network_fleet: WorkerFleet,
    servers: tuple[Served, Served],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    listed, unlisted = servers
    for name, value in fleet_variables(network_fleet).items():
        monkeypatch.setenv(name, value)
    config = tmp_path / "toolq.yaml"
    config.write_text(f"network:\n  - {listed.address}:{listed.port}\n")
    scripts = {"fetch": [("bash", {"command": fetch_both(listed, unlisted)})]}
    log = run_eval(
        [Sample(input="fetch", target=listed.body, id="fetch")],
        tmp_path / "logs",
        [bash(timeout=60)],
        scripts,
        sandbox=("toolq", str(config)),
    )
    assert log.samples is not None
    [sample] = log.samples
    [said] = tool_messages(sample)
    assert sample.scores is not None
    assert sample.scores["answer_file"].value == CORRECT, said.text
    assert unlisted.body not in said.text
    refusal = f"toolq refused {unlisted.address}:{unlisted.port}: {unlisted.address}:"
    assert f"{refusal}{unlisted.port} is not in this run's network list" in said.text


async def test_an_mcp_client_reaches_what_toolq_mcp_network_lists(
    network_fleet: WorkerFleet, servers: tuple[Served, Served], tmp_path: Path
) -> None:
    listed, unlisted = servers
    broker = network_fleet.settings.broker_url
    assert broker is not None
    # The SDK passes its server a few variables of its own: the operator's setting is given.
    env = get_default_environment() | {"TOOLQ_NETWORK_ALLOWED": "list"}
    args = ["mcp", "--broker", broker, "--enable", "run_bash"]
    params = StdioServerParameters(
        command=TOOLQ, args=[*args, "--network", f"{listed.address}:{listed.port}"], env=env
    )
    with (tmp_path / "stderr").open("w") as errlog:
        async with Client(stdio_client(params, errlog=errlog)) as session:
            result = await session.call_tool("run_bash", {"command": fetch_both(listed, unlisted)})
    [content] = result.content
    text = getattr(content, "text", "")
    assert listed.body in text and unlisted.body not in text, text
    assert f"{unlisted.address}:{unlisted.port} is not in this run's network list" in text


def test_toolq_mcp_asking_for_more_than_the_operator_allows_is_one_line(
    network_fleet: WorkerFleet,
) -> None:
    broker = network_fleet.settings.broker_url
    assert broker is not None
    env = get_default_environment() | {"TOOLQ_NETWORK_ALLOWED": "list"}
    done = mcp_refused(["--broker", broker, "--network", "full"], env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        'error: network "full" is not allowed here (TOOLQ_NETWORK_ALLOWED=list)'
    ]
