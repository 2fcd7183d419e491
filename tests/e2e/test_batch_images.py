"""Runs that bring their own environment: ``toolq batch`` items with ``image``, ``toolq run
--image``, ``toolq mcp --image`` and ``Agent(..., image=...)``, on real workers and real
containers (runc), from images built here with busybox and umoci."""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp import Client, StdioServerParameters

from api.conversation.agent import Agent, AgentOptions
from api.local.stack import worker_environment
from api.model.client import model_client
from api.scripted.server import ScriptedServer
from tests.conftest import (
    WorkerFleet,
    orchestrator_settings,
    scripted_server,
    wait_for,
)
from tests.e2e.test_batch_cli import RUN_TIMEOUT_S, TOOLQ, run_batch, write_items
from tests.results_file import finished_records
from tests.worker.images.builders import BUSY_LOOP, Images, built_or_skip
from tests.worker.images.builders import image_fleet as fleet_of_images

pytestmark = pytest.mark.e2e

OS_RELEASE: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "run_bash", "arguments": {"command": "cat /etc/os-release"}}]},
    {"content": "{last_tool_result}"},
]
INSTALL_THEN_USE: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "name": "run_bash",
                "arguments": {"command": "mkdir -p /opt/tool && echo v1 > /opt/tool/version"},
            }
        ]
    },
    {"tool_calls": [{"name": "run_bash", "arguments": {"command": "cat /opt/tool/version"}}]},
    {"content": "{last_tool_result}"},
]

#: A fixed amount of CPU work in the image's shell, whatever the wall time it takes.
BUSY: list[dict[str, Any]] = [
    {
        "tool_calls": [
            {
                "name": "run_bash",
                "arguments": {"command": BUSY_LOOP},
            }
        ]
    },
    {"content": "{last_tool_result}"},
]


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[Path, Images]]:
    yield from built_or_skip()


@pytest.fixture(scope="module")
def image_fleet(built: tuple[Path, Images]) -> Iterator[WorkerFleet]:
    root, _ = built
    with fleet_of_images(root, root) as workers:
        yield workers


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedServer]:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    steps = {"os_release": OS_RELEASE, "install": INSTALL_THEN_USE, "busy": BUSY}
    with scripted_server(scripts, steps, default="Done.") as server:
        yield server


def env_for(fleet: WorkerFleet, model: ScriptedServer) -> dict[str, str]:
    return {
        **os.environ,
        **worker_environment(fleet.settings),
        "OPENAI_BASE_URL": model.base_url,
        "OPENAI_API_KEY": "test",
    }


def item(item_id: str, script: str, **fields: Any) -> dict[str, Any]:
    return {
        "id": item_id,
        "prompt": f"task {item_id}",
        "model": f"scripted:{script}",
        "enable": ["run_bash"],
        **fields,
    }


def test_items_with_different_images_each_run_in_their_own(
    image_fleet: WorkerFleet, built: tuple[Path, Images], model: ScriptedServer, tmp_path: Path
) -> None:
    _, images = built
    source = write_items(
        tmp_path / "in.jsonl",
        [
            item(
                "alpha",
                "os_release",
                image=images.alpha,
                setup="echo prepared > /etc/prepared",
                check="cat /etc/prepared && grep -q toolq-alpha /etc/os-release",
            ),
            item("beta", "os_release", image=images.beta, check="beta-tool"),
            item("state", "install", image=images.alpha, target="v1"),
            item(
                "override",
                "os_release",
                image=images.agent,
                user="root",
                env={"MARK": "set"},
                check='test "$(id -u)" = 0 && test "$MARK" = set && cat hello.txt',
            ),
            item("plain", "os_release"),
            item("missing", "os_release", image=f"oci:{images.layout}:nope"),
            item("noshell", "os_release", image=images.noshell),
        ],
    )
    output = tmp_path / "out.jsonl"
    done = run_batch(source, output, env_for(image_fleet, model), 4)
    assert done.returncode == 1, done.stderr  # two items failed
    assert "Finished: 5 ok, 2 error" in done.stderr
    records = {r["id"]: r for r in finished_records(output)}
    alpha, beta = records["alpha"], records["beta"]
    assert "toolq-alpha" in alpha["answer"] and "toolq-beta" in beta["answer"]
    assert alpha["score"]["passed"] and alpha["check"]["stdout"] == "prepared\n"
    assert beta["score"]["passed"] and beta["check"]["stdout"] == "beta tool here\n"
    for record, reference in ((alpha, images.alpha), (beta, images.beta)):
        assert record["status"] == "ok"
        assert record["image"]["reference"] == reference
        assert record["image"]["digest"].startswith("sha256:")
        assert record["tool_calls"][0]["worker"] is not None
    assert alpha["image"]["digest"] != beta["image"]["digest"]
    # What one call installed, the next call of the run found.
    assert records["state"]["status"] == "ok" and records["state"]["score"]["passed"]
    # The task's user and variables over the image's; what the image had at its WorkingDir
    # came into the workspace.
    override = records["override"]
    assert override["score"]["passed"], override["check"]
    assert override["check"]["stdout"] == "hello from the image\n"
    # No image: today's sandbox, on the worker's own files.
    plain = records["plain"]
    assert plain["image"] is None and "toolq-" not in plain["answer"]
    # A bad image fails its item in one line naming it; the others went on.
    for bad, cause in (("missing", "unknown reference"), ("noshell", "has no /bin/sh")):
        record = records[bad]
        assert record["status"] == "error"
        assert record["error"].startswith("image 'oci:") and cause in record["error"]
        assert "\n" not in record["error"]
    # Every container ended with its run.
    boxes = Path(image_fleet.settings.image_cache) / "boxes"
    assert [p for p in boxes.iterdir() if p.is_dir()] == []


def test_an_items_own_limits_hold_in_its_container(
    image_fleet: WorkerFleet, built: tuple[Path, Images], model: ScriptedServer, tmp_path: Path
) -> None:
    _, images = built
    limits = {"cpu": 0.2, "pids": 8, "memory_mb": 32}
    source = write_items(
        tmp_path / "in.jsonl",
        [
            item(
                "limited",
                "busy",
                image=images.alpha,
                limits=limits,
                check="for i in $(seq 30); do sleep 5 & done; wait",
            )
        ],
    )
    output = tmp_path / "out.jsonl"
    done = run_batch(source, output, env_for(image_fleet, model), 1)
    record = next(iter(finished_records(output)))

    assert record["status"] == "ok", (done.stderr, record)
    busy = json.loads(record["answer"])
    assert busy["stdout"] == "counted\n", busy
    assert "cgroup(memory,pids,cpu)" in busy["isolation"]
    assert busy["usage"]["limits"] | {"timeout_s": None} == limits | {"timeout_s": None}
    # CPU-seconds per wall-second, as the answer tells both, over enough CPU to tell them.
    assert busy["usage"]["cpu_ms"] >= 300, busy
    assert busy["usage"]["cpu_ms"] / busy["duration_ms"] <= 0.3, busy
    # The check's fork bomb stopped at the item's 8 processes.
    assert "can't fork" in record["check"]["stderr"], record["check"]


def test_toolq_run_image(
    image_fleet: WorkerFleet, built: tuple[Path, Images], model: ScriptedServer
) -> None:
    _, images = built
    argv = [
        str(TOOLQ), "run", "What system is this?", "--model", "scripted:os_release",
        "--enable", "run_bash", "--image", images.beta, "--json",
    ]  # fmt: skip
    done = subprocess.run(
        argv,
        env=env_for(image_fleet, model),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert done.returncode == 0, done.stderr
    transcript = json.loads(done.stdout)
    assert "toolq-beta" in transcript["answer"]
    assert transcript["image"]["digest"].startswith("sha256:")
    bad = subprocess.run(
        [*argv[:-3], "--image", f"oci:{images.layout}:nope"],
        env=env_for(image_fleet, model),
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )
    assert bad.returncode == 1
    assert bad.stderr.strip().startswith("error: image 'oci:")
    assert "unknown reference" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


async def test_toolq_mcp_image_runs_the_sessions_commands_in_its_container(
    image_fleet: WorkerFleet, built: tuple[Path, Images]
) -> None:
    _, images = built
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLQ_")}
    env |= worker_environment(image_fleet.settings)
    server = StdioServerParameters(
        command=str(TOOLQ),
        args=["mcp", "--enable", "run_bash", "--image", images.beta],
        env=env,
    )
    async with Client(server) as client:
        await client.call_tool("write_file", {"path": "hello.txt", "content": "hi\n"})
        first = await client.call_tool("run_bash", {"command": "beta-tool; cat hello.txt"})
        assert not first.is_error
        assert _stdout(first) == "beta tool here\nhi\n"
        again = await client.call_tool("run_bash", {"command": "echo $GREETING; pwd"})
        assert _stdout(again) == "from-beta\n/workspace\n"
    boxes = Path(image_fleet.settings.image_cache) / "boxes"
    wait_for(
        lambda: [p for p in boxes.iterdir() if p.is_dir()] == [],
        timeout=30,
        what="the session's container ended",
    )


async def test_an_agent_with_an_image(
    image_fleet: WorkerFleet, built: tuple[Path, Images], model: ScriptedServer
) -> None:
    _, images = built
    settings = orchestrator_settings(image_fleet.settings)
    client = model_client(base_url=model.base_url, api_key="test", timeout=30, max_retries=0)
    options = AgentOptions(model="scripted:os_release", enable=["run_bash"])
    async with Agent(client, options, settings=settings, image=images.alpha) as agent:
        answer = await agent.chat("Which system is this?")
        assert "toolq-alpha" in answer
        record = agent.transcript()["image"]
        assert record["reference"] == images.alpha and record["digest"].startswith("sha256:")
    with pytest.raises(ValueError, match="not an image reference"):
        AgentOptions(image="Not An Image")


def _stdout(result: types.CallToolResult) -> str:
    """run_bash's stdout, from its MCP answer."""
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return str(json.loads(content.text)["stdout"])
