"""One conversation's line in a batch's results: written field for field as before, read back the
same way by every reader, whoever wrote it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from api.batch.attempts import Attempt
from api.batch.progress import BatchStats
from api.batch.record import BatchRecord
from api.batch.report import build_report
from api.batch.results import ResultLog, read_latest
from api.batch.summary import ItemSummary
from api.exceptions import NotABatchRecord
from api.http.viewer.results_file import ResultsFile
from tests.api.batch.conftest import write_lines

#: A line as ``toolq batch`` writes it, every field filled, in the order it writes them.
FULL_LINE: dict[str, Any] = {
    "id": "q1",
    "status": "ok",
    "answer": "42",
    "error": None,
    "stop_reason": "answered",
    "run_id": "b-12345678-q1-abcdef",
    "model": "m",
    "duration_s": 1.25,
    "attempts": 2,
    "earlier_run_ids": ["b-12345678-q1-abcdef"],
    "orchestrator": "host:12",
    "usage": {"prompt_tokens": 30, "completion_tokens": 5, "total_tokens": 35},
    "image": {"reference": "python:3.12", "digest": "sha256:ab", "worker": "w:1"},
    "score": {"passed": True, "method": "check", "explanation": "fine"},
    "setup": {"exit_code": 0, "duration_ms": 12, "stdout": "", "stderr": "", "timed_out": False},
    "check": {"exit_code": 1, "duration_ms": 3, "stdout": "no", "stderr": "", "timed_out": False},
    "artifacts": {"out.txt": {"content": "hi", "encoding": "utf-8", "size": 2}},
    "artifacts_matched": 1,
    "metadata": {"split": "dev", "n": 3},
    "tool_calls": [{"id": "c1", "name": "echo", "is_error": True, "duration_ms": 1.5}],
    "messages": [{"role": "user", "content": "question"}],
}

#: A line of the first toolq batch: none of the task's fields, no attempts, no orchestrator.
OLD_LINE: dict[str, Any] = {
    "id": "q0",
    "status": "error",
    "answer": None,
    "error": "the model API failed",
    "stop_reason": None,
    "run_id": "b-1-q0-2",
    "model": "m",
    "duration_s": 0.5,
    "usage": {"prompt_tokens": 0, "completion_tokens": 0, "total_tokens": 0},
    "tool_calls": [],
    "messages": [],
}


def test_a_full_line_is_written_back_as_the_same_json() -> None:
    record = BatchRecord.read(json.loads(json.dumps(FULL_LINE)))
    assert json.dumps(record.line()) == json.dumps(FULL_LINE)
    assert (record.passed, record.tokens, record.tool_errors) == (True, 35, 1)


def test_a_line_built_from_its_parts_is_the_line_toolq_wrote_before() -> None:
    parts = {key: value for key, value in FULL_LINE.items() if key != "usage"}
    built = BatchRecord(**parts, usage=FULL_LINE["usage"])
    assert list(built.line()) == list(FULL_LINE)
    assert built.line() == FULL_LINE


def test_a_line_of_a_newer_toolq_keeps_its_other_fields() -> None:
    newer = {**FULL_LINE, "cost_usd": 0.25, "score": {**FULL_LINE["score"], "rubric": "r"}}
    assert BatchRecord.read(newer).line() == newer


def test_an_old_line_reads_with_the_documented_defaults() -> None:
    record = BatchRecord.read(OLD_LINE)
    assert (record.status, record.error) == ("error", "the model API failed")
    assert (record.attempts, record.earlier_run_ids, record.orchestrator) == (1, [], None)
    assert (record.score, record.setup, record.check, record.image) == (None, None, None, None)
    assert (record.artifacts, record.artifacts_matched, record.metadata) == (None, None, None)
    assert (record.passed, record.tokens) == (None, 0)


def test_fields_missing_or_of_another_shape_read_as_their_defaults() -> None:
    odd = {
        "id": 7,
        "duration_s": True,
        "answer": ["a"],
        "usage": "lots",
        "tool_calls": "none",
        "score": {"passed": "yes"},
        "attempts": "2",
    }
    record = BatchRecord.read(odd)
    assert record.id == "7"  # an integer id reads as its digits
    assert (record.duration_s, record.answer, record.usage, record.score) == (None,) * 4
    assert (record.tool_calls, record.attempts, record.status) == ([], 1, "error")


@pytest.mark.parametrize("line", [{}, {"prompt": "p"}, {"id": None}, {"id": 1.5}, {"id": ["a"]}])
def test_a_line_without_an_id_is_no_result(line: dict[str, Any]) -> None:
    with pytest.raises(NotABatchRecord, match="no id"):
        BatchRecord.read(line)


def test_only_a_line_that_says_ok_succeeded() -> None:
    """A line without a status, or with one of another shape or value, reads as "error"; only a
    line without one is told apart (an input line: ``toolq report`` leaves it out)."""
    assert BatchRecord.read({"id": "a", "status": "ok"}).status == "ok"
    for status in ("error", "failed", None, 1):
        record = BatchRecord.read({"id": "a", "status": status})
        assert (record.status, record.has_status) == ("error", True)
    missing = BatchRecord.read({"id": "a", "prompt": "p"})
    assert (missing.status, missing.has_status) == ("error", False)


#: Each id's line, and the status every reader gives it.
LINES_AND_STATUSES: list[tuple[dict[str, Any], str]] = [
    ({"id": "ok", "status": "ok", "score": {"passed": True}}, "ok"),
    ({"id": "error", "status": "error", "error": "why"}, "error"),
    ({"id": "null", "status": None}, "error"),
    ({"id": "other", "status": "succeeded"}, "error"),
    ({"id": 5, "status": "ok"}, "ok"),
]


def test_every_reader_gives_a_line_the_same_status(tmp_path: Path) -> None:
    lines = [line for line, _ in LINES_AND_STATUSES]
    expected = {str(line["id"]): status for line, status in LINES_AND_STATUSES}
    out = write_lines(tmp_path / "out.jsonl", lines)

    with ResultLog.open(out) as results:
        assert results.done == expected
    assert read_latest(out, lambda r: r.status).records == expected
    assert {s.id: s.status for s in map(ItemSummary.of, lines)} == expected

    indexed = ResultsFile(out)
    indexed.index()
    assert {s.id: s.status for s in indexed.all_summaries()} == expected

    report = build_report(out)
    assert report["status"] == {"ok": 2, "error": 3}

    stats = BatchStats(total=len(lines))
    for line in lines:
        stats.add(line)
    assert (stats.ok, stats.failed) == (2, 3)
    assert (stats.scored, stats.passed) == (1, 1)


def test_a_line_without_a_status_is_an_error_to_resume_and_no_result_to_the_report(
    tmp_path: Path,
) -> None:
    out = write_lines(tmp_path / "out.jsonl", [{"id": "a", "status": "ok"}, {"id": "b"}])
    with ResultLog.open(out) as results:
        assert results.done == {"a": "ok", "b": "error"}  # --retry-errors runs it again
    report = build_report(out)
    assert (report["items"], report["unreadable_lines"]) == (1, 1)
    assert ItemSummary.of({"id": "b"}).status == "error"


def test_lines_that_are_no_results_are_told_apart_by_every_reader(tmp_path: Path) -> None:
    out = write_lines(tmp_path / "out.jsonl", [{"id": "a", "status": "ok"}, "[1]", {"no_id": 1}])
    with ResultLog.open(out) as results:
        assert (results.done, results.unreadable_lines) == ({"a": "ok"}, [2, 3])
    assert build_report(out)["unreadable_lines"] == 2
    assert ItemSummary.read({"no_id": 1}, "line 3") == ItemSummary.unreadable(
        "line 3", "not a result: it has no id (a string or an integer)"
    )
    indexed = ResultsFile(out)
    indexed.index()
    assert [s.status for s in indexed.all_summaries()] == ["ok", "unreadable", "unreadable"]
    unreadable = indexed.record(2)
    assert unreadable is not None and unreadable["status"] == "unreadable"
    with ResultLog.open(out) as results, pytest.raises(NotABatchRecord):
        results.append({"no_id": 1})
    assert len(out.read_text().splitlines()) == 3  # nothing written


def test_an_agents_pool_line_counts_the_earlier_attempts_and_keeps_the_rest() -> None:
    attempt = Attempt(3, "r-a3", earlier_run_ids=["r", "r-a2"], on_fleet=True)
    counted = attempt.counted_in({**FULL_LINE, "attempts": 1, "earlier_run_ids": []})
    assert counted == {**FULL_LINE, "attempts": 3, "earlier_run_ids": ["r", "r-a2"]}
