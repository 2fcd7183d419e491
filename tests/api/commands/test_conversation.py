"""What ``toolq run --stream`` and ``toolq demo`` print for each event of a conversation."""

from __future__ import annotations

import io

import pytest
from rich.console import Console

from api.commands.conversation import render_event, run_conversation
from api.conversation import events


def rendered(*shown: events.AgentEvent) -> str:
    screen = io.StringIO()
    console = Console(file=screen, width=200, color_system=None, highlight=False)
    for event in shown:
        render_event(event, console)
    return screen.getvalue()


def test_text_is_printed_as_it_comes_without_markup() -> None:
    assert rendered(events.TextDelta("Hello, "), events.TextDelta("[bold]world[/bold]")) == (
        "Hello, [bold]world[/bold]"
    )


def test_a_restarted_stream_says_why_on_a_line_of_its_own() -> None:
    assert rendered(events.TextDelta("half"), events.TextDiscarded("the connection failed")) == (
        "half\n(stream interrupted: the connection failed; retrying)\n"
    )


def test_a_started_call_shows_its_tool_and_arguments() -> None:
    started = events.ToolCallStarted("call_1", "read_file", '{"path": "a.txt"}')

    assert rendered(started) == '\n→ read_file {"path": "a.txt"}\n'


@pytest.mark.parametrize(
    ("error_kind", "output", "line"),
    [
        (None, "first line\nsecond line", "✓ read_file in 12.3 ms on w@h:1: first line\n"),
        (
            "tool_error",
            "Error: no such file",
            "✗ read_file (tool_error) in 12.3 ms on w@h:1: Error: no such file\n",
        ),
        (None, "  \n", "✓ read_file in 12.3 ms on w@h:1: \n"),
    ],
)
def test_a_finished_call_shows_its_outcome_time_worker_and_the_first_line(
    error_kind: str | None, output: str, line: str
) -> None:
    is_error = error_kind is not None
    finished = events.ToolCallFinished(
        "call_1", "read_file", output, is_error, error_kind, 12.34, "w@h:1"
    )

    assert rendered(finished) == line


def test_a_finished_call_with_no_worker_and_a_long_output() -> None:
    finished = events.ToolCallFinished("call_1", "echo", "x" * 300, False, None, 1.0, None)

    assert rendered(finished) == f"✓ echo in 1.0 ms on ?: {'x' * 100}\n"


def test_the_final_answer_ends_the_line() -> None:
    assert rendered(events.TextDelta("Done."), events.FinalAnswer("Done.", "answered")) == "Done.\n"


def test_run_without_a_model_api_says_what_to_set_and_exits_2(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out, err = io.StringIO(), io.StringIO()

    code = run_conversation(
        "hi",
        model=None,
        system=None,
        enable=[],
        max_turns=None,
        stream=False,
        as_json=False,
        console=Console(file=out, width=200),
        err=Console(file=err, width=200),
    )

    assert code == 2
    assert "OPENAI_API_KEY is not set" in err.getvalue()
    assert "toolq demo" in err.getvalue()
    assert out.getvalue() == ""
