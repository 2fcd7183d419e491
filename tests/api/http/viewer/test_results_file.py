"""A results file read lazily: its first page before any index, the index, and its growth."""

from __future__ import annotations

import json
from pathlib import Path

from api.http.viewer.results_file import ResultsFile, ResultsFileSource, results_path_problem
from tests.api.batch.conftest import record, write_lines


def numbered(count: int, start: int = 0) -> list[dict[str, object]]:
    return [record(f"q{n}", "ok" if n % 3 else "error") for n in range(start, start + count)]


async def test_the_first_page_is_read_from_the_start_without_the_index(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "out.jsonl", numbered(500))
    source = ResultsFileSource(path)  # not started: nothing has indexed the file
    first = await source.summaries(source.batch_id, 0, 50)
    assert [s.id for s in first] == [f"q{n}" for n in range(50)]
    assert source.file.count == 0 and source.file.reading
    batch = await source.batch(source.batch_id)
    assert batch is not None and batch.status == "reading" and batch.live


async def test_the_index_holds_every_line_and_reads_any_record(tmp_path: Path) -> None:
    lines: list[str | dict[str, object]] = [
        *numbered(3),
        "",
        "not json {",
        "[1, 2]",
        *numbered(2, 3),
    ]
    path = write_lines(tmp_path / "out.jsonl", lines)
    source = ResultsFileSource(path)
    source.start()
    every = await source.all_summaries(source.batch_id)
    assert [s.id for s in every] == ["q0", "q1", "q2", "line 5", "line 6", "q3", "q4"]
    assert [s.status for s in every][3:5] == ["unreadable", "unreadable"]
    assert (await source.record(source.batch_id, 5)) == record("q3", "error")
    broken = await source.record(source.batch_id, 3)
    assert broken is not None and broken["line"] == "not json {\n"
    assert "line 5 is not JSON" in broken["error"]
    assert await source.record(source.batch_id, 7) is None
    assert await source.record("another.jsonl", 0) is None
    batch = await source.batch(source.batch_id)
    assert batch is not None
    assert (batch.done, batch.ok, batch.error) == (7, 3, 4)
    await source.close()


async def test_the_index_follows_the_file_as_a_batch_appends_to_it(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "out.jsonl", numbered(2))
    source = ResultsFileSource(path)
    source.start()
    assert len(await source.all_summaries(source.batch_id)) == 2
    with path.open("a") as out:
        out.write(json.dumps(record("q2")) + "\n" + '{"id": "q3", "sta')  # q3 is half-written
    assert [s.id for s in await source.all_summaries(source.batch_id)] == ["q0", "q1", "q2"]
    with path.open("a") as out:
        out.write('tus": "ok"}\n')
    assert [s.id for s in await source.all_summaries(source.batch_id)][-1] == "q3"
    batch = await source.batch(source.batch_id)
    assert batch is not None and batch.status == "growing" and batch.done == 4
    await source.close()


def test_a_file_that_is_not_there_is_named_with_why(tmp_path: Path) -> None:
    assert (
        results_path_problem(tmp_path / "nope.jsonl") == f"{tmp_path / 'nope.jsonl'}: no such file"
    )
    assert results_path_problem(tmp_path) == f"{tmp_path}: not a file"
    assert results_path_problem(write_lines(tmp_path / "ok.jsonl", [])) is None


def test_closing_stops_indexing_at_the_next_chunk(tmp_path: Path) -> None:
    file = ResultsFile(write_lines(tmp_path / "out.jsonl", numbered(10)))
    file.close()
    file.index()
    assert file.count == 0 and not file.reading


async def test_an_item_run_again_shows_its_last_line_in_the_place_of_its_first(
    tmp_path: Path,
) -> None:
    # toolq batch --retry-errors appends the new line; readers take each id's last one.
    lines = [record("a", "error"), record("b"), record("c", "error"), record("a")]
    path = write_lines(tmp_path / "out.jsonl", lines)
    source = ResultsFileSource(path)
    source.start()
    every = await source.all_summaries(source.batch_id)
    assert [(s.id, s.status) for s in every] == [("a", "ok"), ("b", "ok"), ("c", "error")]
    assert await source.record(source.batch_id, 0) == record("a")
    batch = await source.batch(source.batch_id)
    assert batch is not None
    assert (batch.done, batch.ok, batch.error) == (3, 2, 1)
    await source.close()
