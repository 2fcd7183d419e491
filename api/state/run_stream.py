"""A conversation streamed into its run's record: each event to the run's event stream, and the
transcript saved as each round of tool calls begins, so that a reader of a run in progress sees
the calls made so far. The API replica and the agents worker run a run the same way."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from typing import cast

from api.conversation.agent import Agent
from api.conversation.events import (
    AgentEvent,
    FinalAnswer,
    ToolCallFinished,
    ToolCallStarted,
    event_to_dict,
)
from api.state.runs import RunStore


async def stream_into_run(store: RunStore, run_id: str, agent: Agent, prompt: str) -> str | None:
    """Run the conversation to its end; its final answer (None when a limit stopped it first)."""
    answer: str | None = None
    open_calls: set[str] = set()
    stream = cast(AsyncGenerator[AgentEvent, None], agent.stream_chat(prompt))
    async with contextlib.aclosing(stream) as events:
        async for event in events:
            if isinstance(event, ToolCallStarted):
                if not open_calls:
                    await store.save_transcript(run_id, agent.transcript())
                open_calls.add(event.id)
            elif isinstance(event, ToolCallFinished):
                open_calls.discard(event.id)
            await store.add_event(run_id, event_to_dict(event))
            if isinstance(event, FinalAnswer):
                answer = event.text
    return answer
