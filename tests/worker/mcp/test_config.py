"""The servers file TOOLQ_MCP_SERVERS names: read once, every mistake named with its place."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from worker.contract.errors import McpConfigError
from worker.contract.mcp_servers import McpServerConfig, load_servers
from worker.contract.settings import WorkerSettings

GOOD = {"name": "files", "command": "mcp-files", "args": ["--root", "/srv"], "pool": "tools"}


def written(tmp_path: Path, content: Any) -> Path:
    path = tmp_path / "servers.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


def test_servers_are_read_with_their_defaults(tmp_path: Path) -> None:
    path = written(tmp_path, [GOOD, {**GOOD, "name": "web", "pool": "sandbox", "idempotent": True}])
    files, web = load_servers(path)
    assert files == McpServerConfig(
        name="files", command="mcp-files", args=["--root", "/srv"], env={}, pool="tools"
    )
    assert not files.idempotent
    assert web.idempotent and web.pool == "sandbox"
    assert files.tool_name("read") == "files__read"


@pytest.mark.parametrize(
    ("content", "said"),
    [
        ("[{", "is not JSON"),
        ({"servers": []}, "must hold a JSON list of servers, not a dict"),
        (
            [{**GOOD, "pool": "gpu"}],
            "server 1 ('files'): pool: Input should be 'tools' or 'sandbox'",
        ),
        ([GOOD, {"command": "x", "pool": "tools"}], "server 2: name: Field required"),
        ([{**GOOD, "name": "a__b"}], "server 1 ('a__b'): name: String should match pattern"),
        ([{**GOOD, "colour": "red"}], "colour: Extra inputs are not permitted"),
        ([GOOD, GOOD], "server 2 ('files'): another server has the name 'files'"),
        ([{**GOOD, "args": ["a\x00b"]}], "contains a NUL byte"),
    ],
)
def test_mistakes_name_the_file_and_the_server(tmp_path: Path, content: Any, said: str) -> None:
    path = written(tmp_path, content)
    with pytest.raises(McpConfigError) as refused:
        load_servers(path)
    assert said in str(refused.value)
    assert str(path) in str(refused.value)


def test_a_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(McpConfigError, match=r"cannot read the MCP servers file .*missing\.json"):
        load_servers(tmp_path / "missing.json")


def test_a_worker_with_a_bad_file_refuses_to_start(tmp_path: Path) -> None:
    path = written(tmp_path, [{**GOOD, "pool": "gpu"}])
    with pytest.raises(ValidationError, match="mcp_servers") as refused:
        WorkerSettings(mcp_servers=path)
    assert "'tools' or 'sandbox'" in str(refused.value)
    assert WorkerSettings(mcp_servers=written(tmp_path, [GOOD])).mcp_servers == path
