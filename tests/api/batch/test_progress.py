"""How far a batch has got: the counts and timings, the progress line, and the closing summary."""

from __future__ import annotations

import io
import time

import pytest
from rich.console import Console

from api.batch.progress import (
    BarProgress,
    BatchOutcome,
    BatchStats,
    PlainProgress,
    progress_display,
    progress_line,
    summary_lines,
)

RESUME = "toolq batch in.jsonl -o out.jsonl --concurrency 4"


def stats_over(seconds: float, total: int, *durations: float, failed: int = 0) -> BatchStats:
    """A finished clock of ``seconds``, one ok conversation per duration, ``failed`` errors."""
    stats = BatchStats(total=total, started=1000.0, finished=1000.0 + seconds)
    for duration in durations:
        stats.add({"id": "q", "status": "ok", "duration_s": duration})
    for _ in range(failed):
        stats.add({"id": "q", "status": "error", "duration_s": 1.0})
    return stats


def console() -> Console:
    return Console(record=True, width=200, file=io.StringIO())


# --- The counts ----------------------------------------------------------------------------------


def test_records_are_counted_by_status_with_their_tool_calls_and_times() -> None:
    stats = BatchStats(total=4)
    calls = [{"is_error": False}, {"is_error": True}]
    stats.add({"id": "a", "status": "ok", "duration_s": 1.5, "tool_calls": calls})
    stats.add({"id": "b", "status": "error", "duration_s": None, "tool_calls": None})
    stats.add({"id": "c", "status": "ok", "duration_s": 3})
    assert (stats.ok, stats.failed, stats.done) == (2, 1, 3)
    assert (stats.tool_calls, stats.tool_errors) == (2, 1)
    assert stats.durations == [1.5, 0.0, 3.0]


def test_rates_and_time_left_follow_the_clock() -> None:
    stats = stats_over(10.0, 10, *[1.0] * 5)
    stats.tool_calls = 20
    assert stats.elapsed == 10.0
    assert stats.rate == 0.5
    assert stats.tool_rate == 2.0
    assert stats.eta_s == 10.0


def test_before_any_time_has_passed_there_is_no_rate_and_no_estimate() -> None:
    stats = stats_over(0.0, 10)
    assert (stats.rate, stats.tool_rate, stats.eta_s) == (0.0, 0.0, None)


def test_the_summary_gives_nearest_rank_percentiles_of_conversation_time() -> None:
    def times(stats: BatchStats) -> list[str]:
        lines = summary_lines(stats, BatchOutcome(output="out.jsonl"))
        return [line for line in lines if line.startswith("Conversation time")]

    assert times(stats_over(1.0, 20, *reversed(range(1, 21)))) == [
        "Conversation time: p50 10.00 s, p95 19.00 s"
    ]
    assert times(stats_over(1.0, 1, 4.2)) == ["Conversation time: p50 4.20 s, p95 4.20 s"]
    assert times(stats_over(1.0, 1)) == []


def test_the_clock_starts_with_the_first_conversation_and_stops_once() -> None:
    stats = stats_over(5.0, 1)
    stats.stop()
    assert stats.elapsed == 5.0  # a second stop keeps the first end
    began = time.monotonic()
    stats.begin()
    assert stats.finished is None
    assert 0 <= stats.elapsed <= time.monotonic() - began  # counted from begin() on
    stats.stop()
    ended = stats.finished
    stats.stop()
    assert stats.finished == ended


# --- The progress line ---------------------------------------------------------------------------


def test_the_progress_line_says_done_failed_rates_and_time_left() -> None:
    stats = stats_over(10.0, 10, *[1.0] * 4, failed=1)
    assert progress_line(stats) == (
        "batch: 5/10 done (50%), 1 failed, 0.5 conversations/s, 0.0 tool calls/s, ETA 10.0 s"
    )


def test_without_items_or_a_rate_the_line_leaves_out_the_percentage_and_the_estimate() -> None:
    assert progress_line(stats_over(0.0, 0)) == (
        "batch: 0/0 done, 0 failed, 0.0 conversations/s, 0.0 tool calls/s, ETA ?"
    )


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [(59.94, "59.9 s"), (125.0, "2m05s"), (3725.0, "1h02m05s")],
)
def test_long_times_are_shown_in_minutes_and_hours(seconds: float, shown: str) -> None:
    stats = stats_over(seconds, 2, 1.0)
    assert progress_line(stats).endswith(f"ETA {shown}")


def test_a_terminal_gets_a_bar_and_anything_else_plain_lines() -> None:
    stats = BatchStats(total=1)
    assert isinstance(progress_display(stats, console()), PlainProgress)
    terminal = Console(file=io.StringIO(), force_terminal=True)
    assert isinstance(progress_display(stats, terminal), BarProgress)


async def test_plain_progress_prints_a_last_line_when_the_batch_stops() -> None:
    stats = stats_over(10.0, 10, *[1.0] * 4, failed=1)
    out = console()
    display = PlainProgress(stats, out, interval_s=3600)
    display.start()
    display.update()
    await display.stop()
    assert out.export_text() == progress_line(stats) + "\n"


async def test_the_bar_shows_the_counts_when_it_stops() -> None:
    stats = stats_over(10.0, 10, *[1.0] * 3, failed=2)
    out = io.StringIO()
    bar = BarProgress(stats, Console(file=out, force_terminal=True, width=200))
    bar.start()
    await bar.stop()
    assert "5/10" in out.getvalue()
    assert "2 failed" in out.getvalue()


# --- The summary ---------------------------------------------------------------------------------


def test_a_finished_batch_is_summed_up_with_what_was_done_before() -> None:
    stats = stats_over(125.0, 4, 1.0, 3.0, failed=1)
    stats.add(
        {"id": "a", "status": "ok", "duration_s": 2.0, "tool_calls": [{}, {"is_error": True}]}
    )
    outcome = BatchOutcome(output="out.jsonl", bad_lines=1, already_done=4, already_failed=2)
    assert summary_lines(stats, outcome) == [
        "Finished: 3 ok, 1 error, 1 bad lines skipped, 4 already done "
        "(2 of them with status error)",
        "Conversation time: p50 1.00 s, p95 3.00 s",
        "Tool calls: 2 (0.0/s), 1 failed (50.0%)",
        "Wall time: 2m05s; results in out.jsonl",
    ]


def test_an_interrupted_batch_says_what_is_left_and_how_to_resume() -> None:
    stats = stats_over(30.0, 10, 1.0, 1.0, 1.0)
    outcome = BatchOutcome(output="out.jsonl", interrupted=True, resume_command=RESUME)
    assert summary_lines(stats, outcome) == [
        "Interrupted: 3 ok, 0 error, 0 bad lines skipped, 0 already done",
        "Conversation time: p50 1.00 s, p95 1.00 s",
        "Tool calls: 0 (0.0/s), 0 failed (0.0%)",
        "Wall time: 30.0 s; results in out.jsonl",
        "7 conversations did not finish and left no line; every finished one is saved.",
        f"Resume with: {RESUME}",
    ]


def test_a_batch_stopped_by_an_error_says_so_and_how_to_resume() -> None:
    stats = stats_over(2.0, 5)
    outcome = BatchOutcome(output="out.jsonl", error="No space left", resume_command=RESUME)
    lines = summary_lines(stats, outcome)
    assert lines[0] == "Stopped by an error: 0 ok, 0 error, 0 bad lines skipped, 0 already done"
    assert not any(line.startswith("Conversation time") for line in lines)  # none finished
    assert lines[-2:] == [
        "5 conversations did not finish and left no line; every finished one is saved.",
        f"Resume with: {RESUME}",
    ]


# --- Scores --------------------------------------------------------------------------------------


def scored(passed: bool) -> dict[str, object]:
    return {
        "id": "q",
        "status": "ok",
        "duration_s": 1.0,
        "score": {"passed": passed, "method": "check"},
    }


def test_scored_items_show_passed_of_scored_as_they_come() -> None:
    stats = stats_over(10.0, 10, 1.0)
    assert stats.scores_text == ""
    assert ", 0 failed, 0.1 conversations/s" in progress_line(stats)
    for passed in (True, True, False):
        stats.add(scored(passed))
    assert (stats.scored, stats.passed) == (3, 2)
    assert "done (40%), 0 failed, 2/3 passed, 0.4 conversations/s" in progress_line(stats)


async def test_the_bar_shows_passed_of_scored() -> None:
    stats = stats_over(10.0, 10, 1.0)
    stats.add(scored(True))
    stats.add(scored(False))
    out = io.StringIO()
    bar = BarProgress(stats, Console(file=out, force_terminal=True, width=200))
    bar.start()
    await bar.stop()
    assert "1/2 passed" in out.getvalue()


def test_the_summary_gives_the_pass_rate_of_the_whole_output_and_the_errors_run_again() -> None:
    stats = stats_over(5.0, 2, 1.0, 1.0)
    outcome = BatchOutcome(output="out.jsonl", already_done=3, retried=2, scored=4, passed=3)
    assert summary_lines(stats, outcome)[:2] == [
        "Finished: 2 ok, 0 error, 0 bad lines skipped, 3 already done, 2 errors run again",
        "Pass rate: 75.0% (3 of 4 scored items; 95% CI 30.1%-95.4%, Wilson)",
    ]
