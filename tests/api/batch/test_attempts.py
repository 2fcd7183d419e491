"""A batch's attempt log: each attempt of an item in a workspace of its own, counted across
stops, and a torn last line cut away."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from api.batch.attempts import AttemptLog, attempt_run_id, attempts_path
from api.batch.tag import batch_run_id, batch_tag_for_output
from worker.contract.wire import RUN_ID_PATTERN

FIRST = "b-12345678-q1-abcdef"


def test_the_log_sits_beside_the_output(tmp_path: Path) -> None:
    assert attempts_path(tmp_path / "out.jsonl") == tmp_path / "out.jsonl.attempts"


def test_an_item_started_before_runs_again_in_a_new_workspace(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl.attempts"
    with AttemptLog.open(path) as attempts:
        first = attempts.begin("q1", FIRST)
        other = attempts.begin("q2", "b-12345678-q2-fedcba")
    assert (first.number, first.run_id, first.earlier_run_ids) == (1, FIRST, [])
    assert (other.number, other.run_id) == (1, "b-12345678-q2-fedcba")

    # The batch was stopped with both in flight; the next run starts each one afresh.
    with AttemptLog.open(path) as resumed:
        second = resumed.begin("q1", FIRST)
        third = resumed.begin("q1", FIRST)  # --retry-errors after that one failed, say
    assert (second.number, second.run_id, second.earlier_run_ids) == (2, f"{FIRST}-a2", [FIRST])
    assert (third.number, third.run_id) == (3, f"{FIRST}-a3")
    assert third.earlier_run_ids == [FIRST, f"{FIRST}-a2"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [(line["id"], line["attempt"]) for line in lines] == [
        ("q1", 1),
        ("q2", 1),
        ("q1", 2),
        ("q1", 3),
    ]


def test_a_torn_last_line_is_cut_away_and_that_attempt_never_counted(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl.attempts"
    with AttemptLog.open(path) as attempts:
        attempts.begin("q1", FIRST)
    with path.open("a") as torn:  # a kill in the middle of logging the second attempt
        torn.write('{"id": "q1", "attempt": 2, "run_')
    with AttemptLog.open(path) as resumed:
        assert resumed.truncated_bytes > 0
        again = resumed.begin("q1", FIRST)
    assert (again.number, again.earlier_run_ids) == (2, [FIRST])
    assert all(json.loads(line) for line in path.read_text().splitlines())


def test_a_line_that_is_not_an_attempt_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl.attempts"
    path.write_text('not json\n{"id": "q1", "attempt": 1, "run_id": "' + FIRST + '"}\n')
    with AttemptLog.open(path) as attempts:
        assert attempts.begin("q1", FIRST).number == 2


def test_an_attempt_sent_to_the_agents_pool_is_known_as_such(tmp_path: Path) -> None:
    path = tmp_path / "out.jsonl.attempts"
    with AttemptLog.open(path) as attempts:
        assert attempts.last("q1") is None
        attempts.begin("q1", FIRST)
        attempts.begin("q1", FIRST, on_fleet=True)
    with AttemptLog.open(path) as resumed:
        last = resumed.last("q1")
    assert last is not None
    assert (last.number, last.run_id, last.on_fleet) == (2, f"{FIRST}-a2", True)
    assert last.earlier_run_ids == [FIRST]


def test_the_agents_pools_runs_add_to_the_earlier_attempts(tmp_path: Path) -> None:
    with AttemptLog.open(tmp_path / "out.jsonl.attempts") as attempts:
        attempts.begin("q1", FIRST)
        attempt = attempts.begin("q1", FIRST, on_fleet=True)
    # The pool ran this attempt's conversation twice: an agents worker died during the first.
    record = {"id": "q1", "run_id": attempt.run_id, "attempts": 2, "earlier_run_ids": []}
    counted = attempt.counted_in(record)
    assert (counted["attempts"], counted["earlier_run_ids"]) == (3, [FIRST])
    assert record["attempts"] == 2  # the pool's record itself is left as it was


def test_attempt_run_ids_are_valid_and_never_another_items(tmp_path: Path) -> None:
    tag = batch_tag_for_output(tmp_path / "out.jsonl")
    ids = ["a", "a-a2", "x" * 500, "ünï", "b-a3"]
    firsts = [batch_run_id(tag, item_id) for item_id in ids]
    later = [attempt_run_id(first, n) for first in firsts for n in (2, 3, 99)]
    assert all(re.fullmatch(RUN_ID_PATTERN, run_id) for run_id in firsts + later)
    assert len(set(firsts + later)) == len(firsts) + len(later)
    assert [attempt_run_id(first, 1) for first in firsts] == firsts


def test_attempts_count_from_one() -> None:
    with pytest.raises(ValueError, match="counted from 1"):
        attempt_run_id(FIRST, 0)
