"""The MCP URL's query: which tools a session has, a deadline for its calls, its network."""

from __future__ import annotations

import pytest
from mcp.shared.exceptions import MCPError
from starlette.datastructures import QueryParams

from api.mcp.http import tool_choice
from api.mcp.server import ToolChoice


def test_tools_are_named_repeated_or_comma_separated() -> None:
    query = QueryParams("enable=run_bash&enable=remove,move&disable=write_file&tool_timeout_ms=900")
    assert tool_choice(query) == ToolChoice(
        enable=("run_bash", "remove", "move"), disable=("write_file",), tool_timeout_ms=900
    )
    assert tool_choice(QueryParams("")) == ToolChoice()


def test_a_sessions_network_is_read_from_the_url() -> None:
    query = QueryParams("network=pypi.org:443,files.pythonhosted.org:443")
    assert tool_choice(query).network == ["pypi.org:443", "files.pythonhosted.org:443"]
    assert tool_choice(QueryParams("network=full")).network == "full"
    assert tool_choice(QueryParams("")).network == "none"


@pytest.mark.parametrize(
    ("query", "said"),
    [
        ("enabel=run_bash", "unknown query parameter(s) enabel"),
        ("tool_timeout_ms=soon", "tool_timeout_ms in the MCP URL must be a positive integer"),
        ("tool_timeout_ms=0", "must be a positive integer, not '0'"),
        ("network=pypi.org", "network destination 'pypi.org' has no port"),
    ],
)
def test_a_bad_query_is_refused_with_what_is_wrong(query: str, said: str) -> None:
    with pytest.raises(MCPError) as refused:
        tool_choice(QueryParams(query))
    assert said in str(refused.value)
