"""The default tool set: which tools, in what order, which are on, and the cap they answer in."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from tests.worker.conftest import BUILT_INS, one_uid
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.sandbox import SandboxConfig
from worker.tools.context import ToolContext
from worker.tools.factory import create_default_tool_registry
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace


def default_tools(
    workspace: Workspace | Path, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
) -> ToolRegistry:
    return create_default_tool_registry(
        ToolContext("You are a test."),
        workspace,
        output_cap_bytes=output_cap_bytes,
        sandbox=SandboxConfig(one_uid(isolation="process")),
    )


def test_the_built_ins_in_order_remove_run_bash_and_bash_session_off(
    workspace: Workspace,
) -> None:
    registry = default_tools(workspace)

    assert registry.get_tool_names() == BUILT_INS
    enabled = [name for name in BUILT_INS if registry.is_tool_enabled(name)]
    off = ("remove", "run_bash", "bash_session")
    assert enabled == [name for name in BUILT_INS if name not in off]


async def test_a_disabled_built_in_is_refused_until_enabled(workspace: Workspace) -> None:
    registry = default_tools(workspace)
    (workspace.root / "a.txt").write_text("to go")

    refused = await registry.run("remove", {"path": "a.txt"})
    registry.enable("remove")
    removed = await registry.run("remove", {"path": "a.txt"})

    assert refused.error_kind == "tool_disabled"
    assert removed.output == "Removed a.txt."
    assert not (workspace.root / "a.txt").exists()


async def test_a_path_is_made_a_workspace(tmp_path: Path) -> None:
    registry = default_tools(tmp_path / "new-run")

    answer = await registry.execute("write_file", {"path": "a.txt", "content": "hi"})

    assert answer == "Wrote 2 bytes to a.txt."
    assert (tmp_path / "new-run" / "a.txt").read_text() == "hi"


async def test_every_tool_that_may_say_a_lot_answers_within_the_cap_it_is_given(
    sandbox_dir: Path,
) -> None:
    registry = default_tools(Workspace(sandbox_dir), output_cap_bytes=700)
    registry.enable("run_bash")
    (sandbox_dir / "big.txt").write_text("word\n" * 20_000)
    for number in range(100):
        (sandbox_dir / f"file-{number:03}.txt").touch()

    calls: dict[str, dict[str, Any]] = {
        "read_file": {"path": "big.txt"},
        "list_dir": {"path": "."},
        "search_text": {"query": "word", "paths": ["."]},
        "search_files": {"pattern": "*.txt"},
    }
    answers = {tool: await registry.run(tool, arguments) for tool, arguments in calls.items()}
    bash = await registry.run("run_bash", {"command": "cat big.txt"})

    for tool, outcome in answers.items():
        assert len(outcome.output.encode()) <= 700, tool
        assert outcome.truncated, tool
    assert json.loads(bash.output)["stdout"].endswith("showing the first 700 of 100,000 bytes]")


async def test_without_a_cap_the_default_applies(workspace: Workspace) -> None:
    registry = default_tools(workspace)
    (workspace.root / "big.txt").write_text("word\n" * 20_000)

    read = await registry.run("read_file", {"path": "big.txt"})

    assert DEFAULT_OUTPUT_CAP_BYTES // 2 < len(read.output.encode()) <= DEFAULT_OUTPUT_CAP_BYTES
    assert f"capped at {DEFAULT_OUTPUT_CAP_BYTES:,} bytes" in read.output


@pytest.mark.skipif(os.geteuid() != 0, reason="run_bash changes user only when run as root")
async def test_as_root_run_bash_writes_into_the_folder_the_caller_made(tmp_path: Path) -> None:
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o755)
    (folder / "notes.txt").write_text("the caller's")
    registry = create_default_tool_registry(ToolContext(), folder)
    registry.enable("run_bash")

    answer = await registry.run("run_bash", {"command": "mkdir -p out && echo hi > out/a.txt"})

    result = json.loads(answer.output)
    assert (result["exit_code"], result["stderr"]) == (0, ""), result
    assert (folder / "out" / "a.txt").read_text() == "hi\n"
    # The folder is open to its run's own group alone, one of the range's.
    owner = folder.stat()
    assert owner.st_gid in UidRange.parse(DEFAULT_UID_RANGE)
    assert stat.S_IMODE(owner.st_mode) == 0o770
    # That folder only: the one above it, and what was in it already, keep their owner.
    assert tmp_path.stat().st_uid == 0
    assert (folder / "notes.txt").stat().st_uid == 0
