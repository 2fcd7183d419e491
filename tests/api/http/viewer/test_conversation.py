"""A conversation as the pages show it: calls in their turn, folded texts, run_bash streams."""

from __future__ import annotations

import json
from typing import Any

from api.http.viewer.conversation import PREVIEW_LINES, Text, from_events, from_transcript


def asked(call_id: str, name: str, arguments: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def test_each_call_is_shown_in_the_turn_that_made_it_with_its_answer() -> None:
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Count"},
        {
            "role": "assistant",
            "content": "On it.",
            "tool_calls": [asked("c1", "read_file", '{"path":"a"}')],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "text"},
        {"role": "assistant", "content": "Done."},
    ]
    calls = [
        {
            "id": "c1",
            "name": "read_file",
            "arguments": '{"path":"a"}',
            "output": "text",
            "is_error": False,
            "error_kind": None,
            "duration_ms": 3.5,
            "wall_ms": 9.0,
            "worker": "host:1",
            "turn": 1,
        },
        {
            "id": "lost",
            "name": "mkdir",
            "arguments": "{",
            "output": "bad",
            "is_error": True,
            "error_kind": "invalid_arguments",
        },
    ]
    view = from_transcript(messages, calls)
    assert [m.role for m in view.messages] == [
        "system",
        "user",
        "assistant",
        "assistant",
        "tool calls",
    ]
    call = view.messages[2].calls[0]
    assert (call.name, call.worker, call.duration_ms, call.turn) == ("read_file", "host:1", 3.5, 1)
    assert call.arguments.text == '{\n  "path": "a"\n}' and call.arguments_valid
    assert call.output is not None and call.output.text == "text" and not call.pending
    orphan = view.messages[-1].calls[0]
    assert orphan.is_error and orphan.error_kind == "invalid_arguments"
    assert not orphan.arguments_valid and orphan.arguments.text == "{"


def test_run_bash_answers_are_split_and_cut_streams_marked() -> None:
    answer = {
        "stdout": "out\n",
        "stderr": "warn",
        "exit_code": 3,
        "timed_out": False,
        "truncated": {"stdout": True, "stderr": False},
    }
    messages = [
        {"role": "assistant", "content": None, "tool_calls": [asked("b", "run_bash", "{}")]}
    ]
    call = from_transcript(
        messages, [{"id": "b", "name": "run_bash", "output": json.dumps(answer)}]
    )
    bash = call.tool_calls[0].bash
    assert bash is not None
    assert (bash.stdout.text, bash.stderr.text, bash.exit_code) == ("out\n", "warn", 3)
    assert bash.stdout_cut and not bash.stderr_cut and call.tool_calls[0].truncated


def test_an_output_cut_at_the_cap_is_marked_by_its_flag_or_its_notice() -> None:
    def one(**fields: object) -> bool:
        messages = [{"role": "assistant", "tool_calls": [asked("x", "read_file", "{}")]}]
        return (
            from_transcript(messages, [{"id": "x", "name": "read_file", **fields}])
            .tool_calls[0]
            .truncated
        )

    assert one(output="all of it") is False
    assert one(output="the start", truncated=True) is True
    notice = "abc\n[output truncated: 90,000 bytes in all, the first 51,200 bytes shown]"
    assert one(output=notice) is True


def test_long_texts_are_folded_after_their_first_lines() -> None:
    short = Text.of("one\ntwo")
    assert short.preview is None and short.lines == 2
    long = Text.of("\n".join(f"line {n}" for n in range(30)))
    assert long.preview == "\n".join(f"line {n}" for n in range(PREVIEW_LINES))
    assert long.lines == 30 and long.size == len(long.text)
    assert Text.of({"a": 1}).text == '{\n  "a": 1\n}'


def test_a_run_still_going_is_built_from_its_events() -> None:
    events: list[dict[str, Any]] = [
        {"type": "text_delta", "text": "Let me "},
        {"type": "text_delta", "text": "look."},
        {"type": "tool_call_started", "id": "1", "name": "list_dir", "arguments": "{}"},
        {
            "type": "tool_call_started",
            "id": "2",
            "name": "run_bash",
            "arguments": '{"command": "ls"}',
        },
        {
            "type": "tool_call_finished",
            "id": "1",
            "name": "list_dir",
            "output": "a.txt",
            "is_error": False,
            "error_kind": None,
            "duration_ms": 2.0,
            "worker": "h:1",
        },
        {"type": "text_delta", "text": "lost"},
    ]
    view = from_events("Look around", events)
    assert [m.role for m in view.messages] == ["user", "assistant"]
    turn = view.messages[1]
    assert turn.text is not None and turn.text.text == "Let me look.lost"
    assert [c.pending for c in turn.calls] == [False, True]
    finished: list[dict[str, Any]] = [
        *events,
        {
            "type": "tool_call_finished",
            "id": "2",
            "name": "run_bash",
            "output": "{}",
            "is_error": True,
            "error_kind": "timeout",
            "duration_ms": 9.0,
            "worker": "h:2",
        },
        {"type": "text_delta", "text": "All "},
        {"type": "text_discarded", "reason": "stream cut"},
        {"type": "text_delta", "text": "There is a.txt."},
        {"type": "final_answer", "text": "There is a.txt.", "stop_reason": "answered"},
    ]
    view = from_events("Look around", finished)
    assert [m.role for m in view.messages] == ["user", "assistant", "assistant"]
    assert view.messages[2].text is not None and view.messages[2].text.text == "There is a.txt."
    assert view.tool_calls[1].error_kind == "timeout"
