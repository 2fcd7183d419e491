"""A conversation as the run and item pages show it: messages, each tool call inside the
assistant turn that made it, long texts folded, run_bash answers split into their streams.

Built from a finished transcript (a batch's output line, a run's saved transcript) or, while a
run is going, from its events so far. Everything here is data; the templates escape every text.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from api.batch.summary import as_number, as_text

#: Texts longer than this are shown folded: their first lines, and the rest on request.
PREVIEW_LINES = 8
PREVIEW_CHARS = 1200
#: The notice the output cap leaves at the end of what it cut (``worker.contract.limits``).
CAP_NOTICE = "[output truncated:"


@dataclass(frozen=True)
class Text:
    """A text with what its folded view needs: the first lines, its length and size."""

    text: str
    lines: int
    size: int
    preview: str | None

    @classmethod
    def of(cls, value: object) -> Text:
        text = value if isinstance(value, str) else json.dumps(value, indent=2, default=str)
        lines = text.split("\n")
        folded = len(lines) > PREVIEW_LINES or len(text) > PREVIEW_CHARS
        preview = "\n".join(lines[:PREVIEW_LINES])[:PREVIEW_CHARS] if folded else None
        return cls(text, len(lines), len(text.encode("utf-8", "replace")), preview)


@dataclass(frozen=True)
class BashOutput:
    """A run_bash answer: its streams, how it ended, and which stream the cap cut."""

    stdout: Text
    stderr: Text
    exit_code: int | None
    timed_out: bool
    stdout_cut: bool
    stderr_cut: bool


@dataclass
class ToolCallView:
    id: str
    name: str
    arguments: Text
    arguments_valid: bool
    output: Text | None = None
    is_error: bool = False
    error_kind: str | None = None
    duration_ms: float | None = None
    wall_ms: float | None = None
    worker: str | None = None
    turn: int | None = None
    truncated: bool = False
    bash: BashOutput | None = None
    #: Connections the run's network allowed and refused for this call; None without network.
    network: tuple[int, int] | None = None

    @property
    def pending(self) -> bool:
        return self.output is None

    def finish(self, call: Mapping[str, Any]) -> None:
        output = str(call.get("output") or "")
        self.output = Text.of(output)
        self.is_error = bool(call.get("is_error"))
        self.error_kind = as_text(call.get("error_kind"))
        self.duration_ms = as_number(call.get("duration_ms"))
        self.wall_ms = as_number(call.get("wall_ms"))
        self.worker = as_text(call.get("worker"))
        turn = call.get("turn")
        self.turn = turn if isinstance(turn, int) else None
        self.bash = _bash_output(output) if self.name == "run_bash" else None
        cut_streams = self.bash is not None and (self.bash.stdout_cut or self.bash.stderr_cut)
        self.truncated = bool(call.get("truncated")) or CAP_NOTICE in output or cut_streams
        self.network = _network_counts(call.get("usage"))


@dataclass
class MessageView:
    role: str
    text: Text | None = None
    calls: list[ToolCallView] = field(default_factory=list)

    @property
    def calls_done(self) -> bool:
        return all(not call.pending for call in self.calls)


@dataclass
class ConversationView:
    messages: list[MessageView]

    @property
    def tool_calls(self) -> list[ToolCallView]:
        return [call for message in self.messages for call in message.calls]

    @property
    def network(self) -> tuple[int, int] | None:
        """Connections the run's network allowed and refused, over its calls; None where no
        call had a network."""
        counted = [call.network for call in self.tool_calls if call.network is not None]
        if not counted:
            return None
        return sum(a for a, _ in counted), sum(r for _, r in counted)


def _network_counts(usage: object) -> tuple[int, int] | None:
    """(allowed, refused) from a call's ``usage`` (``ResourceUsage``), where it counted them."""
    if not isinstance(usage, Mapping):
        return None
    allowed, refused = usage.get("network_allowed"), usage.get("network_refused")
    if not isinstance(allowed, int) or not isinstance(refused, int):
        return None
    return allowed, refused


def from_transcript(
    messages: Iterable[Mapping[str, Any]], tool_calls: Iterable[Mapping[str, Any]]
) -> ConversationView:
    """A finished (or saved) conversation: its messages, with each call where it was made."""
    records = {str(call.get("id")): call for call in tool_calls if isinstance(call, Mapping)}
    placed: set[str] = set()
    views: list[MessageView] = []
    for message in messages:
        role = str(message.get("role", "unknown"))
        if role == "tool" and str(message.get("tool_call_id")) in placed:
            continue  # shown with the call that asked for it
        view = MessageView(role, _content(message.get("content")))
        for asked in message.get("tool_calls") or []:
            function = asked.get("function") or {}
            call_id = str(asked.get("id"))
            call = _call(call_id, str(function.get("name", "?")), function.get("arguments", ""))
            if call_id in records:
                call.finish(records[call_id])
                placed.add(call_id)
            view.calls.append(call)
        views.append(view)
    unplaced = [record for call_id, record in records.items() if call_id not in placed]
    if unplaced:  # calls whose assistant message is missing: shown rather than lost
        orphans = MessageView("tool calls")
        for record in unplaced:
            call = _call(str(record.get("id")), str(record.get("name")), record.get("arguments"))
            call.finish(record)
            orphans.calls.append(call)
        views.append(orphans)
    return ConversationView(views)


def from_events(prompt: str, events: Iterable[Mapping[str, Any]]) -> ConversationView:
    """A conversation still going, from its events: text as it streamed, calls as they ran."""
    views = [MessageView("user", Text.of(prompt))]
    current: MessageView | None = None
    calls: dict[str, ToolCallView] = {}

    def turn() -> MessageView:
        nonlocal current
        if current is None or (current.calls and current.calls_done):
            current = MessageView("assistant")
            views.append(current)
        return current

    for event in events:
        kind = event.get("type")
        if kind == "text_delta":
            message = turn()
            so_far = message.text.text if message.text else ""
            message.text = Text.of(so_far + str(event.get("text", "")))
        elif kind == "text_discarded" and current is not None:
            current.text = None
        elif kind == "tool_call_started":
            call = _call(str(event.get("id")), str(event.get("name")), event.get("arguments"))
            turn().calls.append(call)
            calls[call.id] = call
        elif kind == "tool_call_finished" and str(event.get("id")) in calls:
            calls[str(event.get("id"))].finish(event)
        elif kind == "final_answer":
            message = turn()
            if message.calls or message.text is None:
                message = MessageView("assistant")
                views.append(message)
            message.text = Text.of(str(event.get("text", "")))
    return ConversationView(views)


def _call(call_id: str, name: str, arguments: object) -> ToolCallView:
    raw = arguments if isinstance(arguments, str) else json.dumps(arguments)
    try:
        parsed = json.loads(raw) if raw.strip() else {}
    except ValueError:
        return ToolCallView(call_id, name, Text.of(raw), arguments_valid=False)
    return ToolCallView(
        call_id, name, Text.of(json.dumps(parsed, indent=2, ensure_ascii=False)), True
    )


def _bash_output(output: str) -> BashOutput | None:
    try:
        answer = json.loads(output)
    except ValueError:
        return None
    if not isinstance(answer, dict) or not {"stdout", "stderr", "exit_code"} <= answer.keys():
        return None
    cut = answer.get("truncated")
    cut = cut if isinstance(cut, dict) else {}
    exit_code = answer.get("exit_code")
    return BashOutput(
        stdout=Text.of(str(answer.get("stdout") or "")),
        stderr=Text.of(str(answer.get("stderr") or "")),
        exit_code=exit_code if isinstance(exit_code, int) else None,
        timed_out=bool(answer.get("timed_out")),
        stdout_cut=bool(cut.get("stdout")),
        stderr_cut=bool(cut.get("stderr")),
    )


def _content(content: object) -> Text | None:
    if content is None or content == "":
        return None
    if isinstance(content, list):  # content parts: their text
        content = "".join(
            str(part.get("text", "")) for part in content if isinstance(part, Mapping)
        )
    return Text.of(content)
