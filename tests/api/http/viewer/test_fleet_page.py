"""The fleet page on a real `toolq serve` and real workers, after a run whose model called a tool
switched off for it, a tool nobody serves and one that ran: the refused calls count apart from
the tools' latency, and the service operations apart from the tools."""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import pytest

from tests.api.http.serving import Replica

pytestmark = pytest.mark.integration

SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "calls": [
        {
            "tool_calls": [
                {"name": "run_bash", "arguments": {"command": "true"}},  # off unless enabled
                {"name": "remove_everything", "arguments": {}},  # no worker serves it
                {"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}},
            ]
        },
        {"content": "Done."},
    ]
}


def latency_rows(page: str) -> dict[str, list[str]]:
    """The latency table: tool -> its cells (calls, failed, p50, p95, refused)."""
    table = page.split('id="latency-title"', 1)[1]
    found = re.findall(r"<tr><th scope=\"row\"><code>([^<]+)</code></th>(.*?)</tr>", table)
    return {
        tool: [unescape(c) for c in re.findall(r">([^<]*)</td>", cells)] for tool, cells in found
    }


def listed(section: str, heading: str) -> list[str]:
    """The names in the list under ``heading`` in one pool's section of the page."""
    after = section.split(f"<h3>{heading}</h3>", 1)
    if len(after) == 1:
        return []
    names = after[1].split("</ul>", 1)[0]
    return re.findall(r"<li><code>([^<]+)</code></li>", names)


def test_refused_calls_and_service_operations_are_apart(server: Replica) -> None:
    run_id = server.create_run("calls")
    finished = server.wait_status(run_id, "succeeded", "failed")
    assert finished["status"] == "succeeded", finished
    kinds = {call["name"]: call["error_kind"] for call in finished["transcript"]["tool_calls"]}
    assert kinds == {
        "run_bash": "tool_disabled",
        "remove_everything": "unknown_tool",
        "write_file": None,
    }

    page = server.client.get("/ui/page/fleet").text

    rows = latency_rows(page)
    # calls, failed, p50, p95, refused: a refused call has no latency and is no failure.
    assert rows["run_bash"] == ["0", "0", "—", "—", "1"]
    assert rows["unknown"] == ["0", "0", "—", "—", "1"]
    calls, failed, p50, _, refused = rows["write_file"]
    assert (calls, failed, refused) == ("1", "0", "0") and p50.endswith(" ms")
    pools = {
        name: body for name, body in re.findall(r'<h2 id="pool-(\w+)">(.*?)</section>', page, re.S)
    }
    tools, sandbox = pools["tools"], pools["sandbox"]
    assert "write_file" in listed(tools, "Tools")
    assert not [name for name in listed(tools, "Tools") if name.startswith("toolq.")]
    assert "toolq.put_files" in listed(tools, "Service operations")
    assert listed(sandbox, "Tools") == ["run_bash", "bash_session"]
    assert "toolq.exec" in listed(sandbox, "Service operations")
