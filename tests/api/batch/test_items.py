"""A batch's input lines: each checked and, when bad, reported by number with the reason."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from api.batch.input_scan import scan_input
from api.batch.items import BatchItem, ItemLimits, parse_item
from api.calls.fleet import Fleet
from api.settings import OrchestratorSettings
from tests.api.batch.conftest import write_lines
from tests.conftest import tool_spec
from worker.contract.wire import WorkerInfo


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
        ('{"id": "a, "prompt": "p"}', "not JSON (Expecting ',' delimiter at column 13)"),
        ('{"id": "a", "prompt": "p', "not JSON (Unterminated string starting at column 23)"),
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


# --- Tasks ---------------------------------------------------------------------------------------


def test_a_task_takes_files_commands_scoring_artifacts_limits_and_metadata() -> None:
    item = parse_item(
        json.dumps(
            {
                "id": "t",
                "prompt": "fix it",
                "files": {"src/a.py": "print(1)\n", "data/blob.bin": {"base64": "AAEC/w=="}},
                "setup": "pip --version",
                "setup_timeout_s": 20,
                "target": "fixed",
                "check": "python -m pytest -q",
                "check_timeout_s": 30.5,
                "artifacts": ["out/*.txt", "**/*.log"],
                "time_limit_s": 60,
                "token_limit": 5000,
                "metadata": {"split": "dev", "difficulty": 3},
            }
        )
    )
    assert item.file_contents() == {"src/a.py": "print(1)\n", "data/blob.bin": b"\x00\x01\x02\xff"}
    assert item.is_task
    assert (item.setup_timeout_s, item.check_timeout_s) == (20, 30.5)
    assert item.metadata == {"split": "dev", "difficulty": 3}
    plain = parse_item('{"id": "p", "prompt": "hi", "target": "x", "metadata": {}}')
    assert not plain.is_task  # a target and metadata need nothing of the workspace


def test_a_command_timeout_defaults_to_300_s_or_what_the_fleet_allows() -> None:
    assert ItemLimits().command_timeout_s(None) == 300
    assert ItemLimits(max_call_s=20).command_timeout_s(None) == 19
    assert ItemLimits(max_call_s=20).command_timeout_s(5) == 5
    settings = OrchestratorSettings(max_timeout_ms=90_000, task_files_max_bytes=7)
    assert ItemLimits.from_settings(settings) == ItemLimits(files_max_bytes=7, max_call_s=90)


def task_line(**fields: object) -> str:
    return json.dumps({"id": "t", "prompt": "p", **fields})


@pytest.mark.parametrize(
    ("fields", "reason"),
    [
        ({"files": {"/etc/passwd": "x"}}, "files: '/etc/passwd' is absolute"),
        ({"files": {"../up.txt": "x"}}, "files: '../up.txt' leads outside the workspace"),
        ({"files": {"a/../../up.txt": "x"}}, "files: 'a/../../up.txt' leads outside"),
        ({"files": {"": "x"}}, "files: '' is not a file name"),
        ({"files": {"dir/": "x"}}, "files: 'dir/' names a directory"),
        ({"files": {"a\u0000b": "x"}}, "contains a NUL byte"),
        ({"files": {"a.txt": 5}}, "files: 'a.txt': the content must be a string (UTF-8 text)"),
        ({"files": {"a.txt": None}}, 'or {"base64": "..."}, not null'),
        ({"files": {"a.txt": {"text": "x"}}}, "not an object with the keys 'text'"),
        ({"files": {"a.txt": {"base64": "not base64!"}}}, "'a.txt': the base64 content is not"),
        ({"files": {"a.txt": {"base64": 7}}}, "'a.txt': the base64 content is not valid"),
        ({"files": ["a.txt"]}, "files: Input should be a valid dictionary"),
        ({"artifacts": ["../*"]}, "artifacts: the pattern '../*' contains '..'"),
        ({"artifacts": ["/etc/*"]}, "artifacts: the pattern '/etc/*' is absolute"),
        ({"artifacts": ["./"]}, "artifacts: the pattern './' names no files"),
        ({"artifacts": ["out//*.txt"]}, "artifacts: the pattern 'out//*.txt' is not a plain path"),
        ({"files": {"a/../b.txt": "x"}}, "files: 'a/../b.txt' is not a plain path"),
        ({"files": {"./b.txt": "x"}}, "files: './b.txt' is not a plain path"),
        ({"artifacts": "out/*"}, "artifacts: Input should be a valid list"),
        ({"setup": 5}, "setup: Input should be a valid string"),
        ({"check": ["pytest"]}, "check: Input should be a valid string"),
        ({"setup": ""}, "setup: String should have at least 1 character"),
        ({"target": 42}, "target: Input should be a valid string"),
        ({"target": "  "}, "target: the target is blank"),
        ({"time_limit_s": -1}, "time_limit_s: Input should be greater than 0"),
        ({"token_limit": -5}, "token_limit: Input should be greater than 0"),
        ({"setup_timeout_s": 0}, "setup_timeout_s: Input should be greater than 0"),
        ({"check_timeout_s": -3}, "check_timeout_s: Input should be greater than 0"),
        ({"check_timeout_s": 600}, "check_timeout_s: 600 s is more than this fleet allows"),
        ({"metadata": [1, 2]}, "metadata: Input should be a valid dictionary"),
    ],
)
def test_a_bad_task_field_is_named_with_what_is_wrong(
    fields: dict[str, object], reason: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(reason)):
        parse_item(task_line(**fields))


def test_a_key_that_is_not_a_string_is_refused() -> None:
    # JSON keys are always strings; a caller building items in Python can get this wrong.
    with pytest.raises(ValidationError, match="the key 1 is not a string"):
        BatchItem.model_validate({"id": "t", "prompt": "p", "files": {1: "x"}})


def test_files_over_the_limit_are_refused_counting_decoded_bytes() -> None:
    limits = ItemLimits(files_max_bytes=10)
    ten = {"a.txt": "12345", "b.bin": {"base64": "AAAAAAA="}}  # 5 + 5 bytes
    assert parse_item(task_line(files=ten), limits).file_contents()["b.bin"] == bytes(5)
    with pytest.raises(
        ValueError, match=re.escape("files: 11 bytes in all, more than TOOLQ_TASK_")
    ):
        parse_item(task_line(files={**ten, "c": "!"}), limits)


def test_bad_task_lines_are_skipped_and_the_rest_runs(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "in.jsonl",
        [
            {"id": "a", "prompt": "p", "files": {"x.txt": "x"}},
            {"id": "b", "prompt": "p", "files": {"x.txt": "x" * 20}},
            {"id": "c", "prompt": "p", "artifacts": ["../*"], "token_limit": 0},
        ],
    )
    scan = scan_input(path, {}, limits=ItemLimits(files_max_bytes=10))
    assert [(bad.number, bad.reason.split(":")[0]) for bad in scan.bad_lines] == [
        (2, "files"),
        (3, "artifacts"),
    ]
    assert "; token_limit: Input should be greater" in scan.bad_lines[1].reason  # every problem
    assert [item.id for item in scan.items()] == ["a"]


def test_retrying_errors_runs_the_items_whose_line_has_status_error(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "in.jsonl", [{"id": n, "prompt": "p"} for n in "abcd"])
    done = {"a": "ok", "b": "error", "c": "error"}
    plain = scan_input(path, done)
    assert [item.id for item in plain.items()] == ["d"]
    retried = scan_input(path, done, retry_errors=True)
    assert [item.id for item in retried.items()] == ["b", "c", "d"]
    assert (retried.retried, retried.already_done, retried.already_failed) == (2, 1, 0)
