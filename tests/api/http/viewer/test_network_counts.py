"""The connections a run's network allowed and refused show in its usage and in the viewer: per
call, and added up for the run."""

from __future__ import annotations

from typing import Any

from api.http.viewer.conversation import from_transcript
from api.state.runs import _with_network

CALLS: list[dict[str, Any]] = [
    {
        "id": "a",
        "name": "run_bash",
        "output": "{}",
        "usage": {"network_allowed": 2, "network_refused": 1},
    },
    {
        "id": "b",
        "name": "run_bash",
        "output": "{}",
        "usage": {"network_allowed": 0, "network_refused": 3},
    },
    {"id": "c", "name": "read_file", "output": "x", "usage": None},
]
MESSAGES: list[dict[str, Any]] = [
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": c["id"], "function": {"name": c["name"], "arguments": "{}"}} for c in CALLS
        ],
    }
]


def test_a_runs_usage_adds_up_its_calls_connections() -> None:
    usage = _with_network({"total_tokens": 10}, {"tool_calls": CALLS})
    assert usage == {"total_tokens": 10, "network_allowed": 2, "network_refused": 4}
    assert _with_network({"total_tokens": 10}, {"tool_calls": CALLS[2:]}) == {"total_tokens": 10}


def test_the_viewer_shows_each_calls_connections_and_the_runs() -> None:
    view = from_transcript(MESSAGES, CALLS)
    assert [call.network for call in view.tool_calls] == [(2, 1), (0, 3), None]
    assert view.network == (2, 4)
