"""A chat request's body as the JSON bytes the openai client would send: built from wire-format
messages and tool schemas as they are, each list of tools encoded once per process."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any


def chat_body(
    model: str,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None,
    *,
    stream: bool,
) -> dict[str, Any]:
    """The JSON body ``chat.completions.create`` would send for these arguments.

    Messages and tool schemas are already wire-format dicts; ``create`` would walk every one of
    them, every turn, through its type-driven transform, which cost more CPU than the rest of
    the request once conversations grow.
    """
    body: dict[str, Any] = {"model": model, "messages": list(messages)}
    if tools:  # providers reject an empty list, so no tools means no parameter
        body["tools"] = list(tools)
    if stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    return body


#: The few tool lists a process offers, by their tools' names: a batch offers one to all its
#: conversations, every turn.
_TOOL_LISTS_KEPT = 8


class EncodedBodies:
    """Request bodies as the JSON bytes the client would send, with each list of tools encoded
    once: the same few thousand bytes of schemas go with every turn of every conversation, and
    the client would encode them anew each time. A list counts as the same when it equals the
    one encoded (compared as data, far cheaper than encoding)."""

    def __init__(self) -> None:
        self._lists: dict[tuple[str, ...], tuple[list[Any], bytes]] = {}

    def body(
        self,
        model: str,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        *,
        stream: bool,
    ) -> dict[str, Any]:
        """``post``'s body argument: ``content`` (the encoded JSON), or ``body`` (a dict the
        client encodes itself) for anything plain JSON cannot hold."""
        try:
            head = _json(chat_body(model, messages, None, stream=stream))
            return {
                "content": head[:-1] + b',"tools":' + self._encoded(tools) + b"}" if tools else head
            }
        except (TypeError, ValueError):
            return {"body": chat_body(model, messages, tools, stream=stream)}

    def _encoded(self, tools: Sequence[Mapping[str, Any]]) -> bytes:
        names = tuple(str(tool.get("function", {}).get("name")) for tool in tools)
        kept = self._lists.get(names)
        if kept is not None and kept[0] == tools:
            return kept[1]
        encoded = _json(list(tools))
        # Compared next time against a copy of its own, which no caller can change.
        copy = json.loads(encoded)
        if copy == tools:
            if len(self._lists) >= _TOOL_LISTS_KEPT:
                self._lists.clear()
            self._lists[names] = (copy, encoded)
        return encoded


def _json(value: object) -> bytes:
    """JSON as the openai client encodes a body: compact, UTF-8, no NaN."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()
