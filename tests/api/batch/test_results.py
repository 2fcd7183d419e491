"""A batch's output file: whole lines, a torn last line cut away, one writer at a time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from api.batch.results import ResultLog, read_latest
from api.exceptions import OutputBusyError
from tests.api.batch.conftest import record, write_lines


def test_records_are_whole_lines_and_a_reopened_log_knows_them(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultLog.open(out) as results:
        results.append(record("a"))
        results.append(record("b", "error"))
    lines = out.read_text().splitlines(keepends=True)
    assert all(line.endswith("\n") for line in lines)
    assert [json.loads(line)["id"] for line in lines] == ["a", "b"]
    with ResultLog.open(out) as again:
        assert again.done == {"a": "ok", "b": "error"}
        assert again.truncated_bytes == 0
        again.append(record("c"))
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b", "c"]


def test_a_partial_last_line_is_cut_away_on_open(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    whole = json.dumps(record("a")) + "\n"
    torn = json.dumps(record("b"))[:25]
    out.write_text(whole + torn)
    with ResultLog.open(out) as results:
        assert results.truncated_bytes == len(torn.encode())
        assert results.done == {"a": "ok"}
        results.append(record("b"))
    assert [json.loads(line)["id"] for line in out.read_text().splitlines()] == ["a", "b"]


def test_an_output_that_is_only_a_partial_line_becomes_empty(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_bytes(b'{"id": "a", "sta' * 10_000)  # longer than one backwards read
    with ResultLog.open(out) as results:
        assert results.done == {}
    assert out.read_bytes() == b""


def test_lines_that_are_not_records_are_reported_and_their_items_run_again(
    tmp_path: Path,
) -> None:
    out = write_lines(tmp_path / "out.jsonl", [record("a"), "garbage", {"no_id": 1}])
    with ResultLog.open(out) as results:
        assert results.done == {"a": "ok"}
        assert results.unreadable_lines == [2, 3]


def test_two_batches_cannot_append_to_one_output(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    with ResultLog.open(out), pytest.raises(OutputBusyError, match="another toolq batch"):
        ResultLog.open(out)
    ResultLog.open(out).close()  # free again once the first one closed


def test_an_id_run_again_is_known_by_its_last_line(tmp_path: Path) -> None:
    out = write_lines(
        tmp_path / "out.jsonl",
        [
            record("a", "error"),
            record("b", score={"passed": False, "method": "check", "explanation": ""}),
            record("c", score=None),
            record("a", score={"passed": True, "method": "target", "explanation": ""}),
            "[1, 2]",
        ],
    )
    latest = read_latest(out, lambda r: r.status)
    assert latest.records == {"a": "ok", "b": "ok", "c": "ok"}
    assert latest.unreadable == [5]
    with ResultLog.open(out) as results:
        assert results.done == {"a": "ok", "b": "ok", "c": "ok"}
        assert results.passed == {"a": True, "b": False}
        results.append(record("b", "error"))  # run again; its score is gone with its old line
        assert results.passed == {"a": True}
        assert results.done["b"] == "error"
