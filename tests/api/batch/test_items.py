"""A batch's input lines: each checked and, when bad, reported by number with the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from api.batch.items import BatchItem, parse_item, scan_input
from api.fleet import Fleet
from tests.api.batch.conftest import write_lines
from tests.conftest import tool_spec
from worker.protocol import WorkerInfo


def test_an_item_takes_its_optional_fields() -> None:
    item = parse_item(
        json.dumps(
            {
                "id": "a",
                "prompt": "hi",
                "system_prompt": "be brief",
                "model": "m",
                "enable": ["run_bash"],
                "max_turns": 3,
            }
        )
    )
    assert item == BatchItem(
        id="a", prompt="hi", system_prompt="be brief", model="m", enable=["run_bash"], max_turns=3
    )
    assert parse_item(b'{"id": "b", "prompt": "p"}').enable == []


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        ("not json", "not JSON"),
        ('{"id": "a", "prompt": "p"', "not JSON"),
        ('["id", "prompt"]', "not a JSON object but an array"),
        ('"text"', "not a JSON object but a string"),
        ('{"prompt": "p"}', "missing 'id'"),
        ('{"id": "a"}', "missing 'prompt'"),
        ('{"id": "a", "prompt": "p", "temperature": 1}', "unknown field 'temperature'"),
        ('{"id": "", "prompt": "p"}', "id: String should have at least 1 character"),
        ('{"id": 7, "prompt": "p"}', "id: Input should be a valid string"),
        ('{"id": "a", "prompt": "p", "max_turns": 0}', "max_turns: Input should be greater"),
        ('{"id": "a", "prompt": "p", "enable": "run_bash"}', "enable: Input should be a valid"),
    ],
)
def test_a_bad_line_says_what_is_wrong(line: str, reason: str) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_item(line)


def test_a_line_that_is_not_utf8_is_bad() -> None:
    with pytest.raises(ValueError, match="not UTF-8"):
        parse_item(b'{"id": "a", "prompt": "\xff"}')


def test_bad_lines_are_reported_by_number_and_the_good_ones_run(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "in.jsonl",
        [
            {"id": "a", "prompt": "one"},
            "{broken",
            "",
            {"id": "b", "prompt": "two"},
            {"id": "a", "prompt": "again"},
            {"id": "c"},
            "   ",
            {"id": "d", "prompt": "four"},
        ],
    )
    scan = scan_input(path, {})
    assert [(bad.number, bad.reason.split(" (")[0]) for bad in scan.bad_lines] == [
        (2, "not JSON"),
        (5, "duplicate id 'a'"),
        (6, "missing 'prompt'"),
    ]
    assert "first on line 1" in scan.bad_lines[1].reason
    assert [item.id for item in scan.items()] == ["a", "b", "d"]
    assert [item.prompt for item in scan.items()] == ["one", "two", "four"]


def test_ids_already_in_the_output_are_skipped_and_counted(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "in.jsonl",
        [{"id": name, "prompt": "p"} for name in ("a", "b", "c", "d")],
    )
    scan = scan_input(path, {"b": "ok", "d": "error", "zz": "ok"})
    assert [item.id for item in scan.items()] == ["a", "c"]
    assert (scan.already_done, scan.already_failed) == (2, 1)


def test_a_line_enabling_a_tool_no_live_worker_serves_is_bad(tmp_path: Path) -> None:
    worker = WorkerInfo(worker="tools@h", pools=["tools"], host="h", pid=1, started=0)
    fleet = Fleet(
        tools={"read_file": tool_spec("read_file"), "run_bash": tool_spec("run_bash", "sandbox")},
        workers={"tools": [worker], "sandbox": []},
    )
    path = write_lines(
        tmp_path / "in.jsonl",
        [
            {"id": "plain", "prompt": "p"},
            {"id": "typo", "prompt": "p", "enable": ["read_flie"]},
            "{broken",
            {"id": "no-sandbox", "prompt": "p", "enable": ["read_file", "run_bash"]},
            {"id": "served", "prompt": "p", "enable": ["read_file"]},
        ],
    )
    scan = scan_input(path, {})

    refused = scan.refuse_unserved(fleet.unserved)

    assert [(bad.number, bad.reason) for bad in refused] == [
        (2, "enable: no worker serves a tool named 'read_flie' (tools: read_file, run_bash)"),
        (4, "enable: no live worker serves the 'sandbox' pool of 'run_bash'"),
    ]
    assert [bad.number for bad in scan.bad_lines] == [2, 3, 4]
    assert [item.id for item in scan.items()] == ["plain", "served"]
