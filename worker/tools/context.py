"""The agent state that tools may read: system prompt, conversation so far, where to save it."""

from __future__ import annotations

from collections.abc import Callable

from worker.contract.wire import Message, ToolContextSnapshot

__all__ = ["Message", "ToolContext", "ToolContextSnapshot"]


class ToolContext:
    """Agent state shared with tools.

    Tools hold the context object, not copies of its values, and read through properties, so a
    change made after a tool was built (a new system prompt, a cleared conversation) is what the
    tool sees on its next call. A context can also read from a live source (the agent) through
    ``source``, which is how the orchestrator keeps the snapshot sent with each call current.
    """

    def __init__(
        self,
        system_prompt: str = "",
        session_context: list[Message] | None = None,
        session_context_file_path: str = "session_context.json",
        *,
        source: Callable[[], ToolContextSnapshot] | None = None,
    ) -> None:
        self._system_prompt = system_prompt
        self._session_context: list[Message] = (
            session_context if session_context is not None else []
        )
        self._session_context_file_path = session_context_file_path
        self._source = source

    @property
    def system_prompt(self) -> str:
        return self._source().system_prompt if self._source else self._system_prompt

    @system_prompt.setter
    def system_prompt(self, value: str) -> None:
        self._system_prompt = value

    @property
    def session_context(self) -> list[Message]:
        return self._source().session_context if self._source else self._session_context

    @session_context.setter
    def session_context(self, value: list[Message]) -> None:
        self._session_context = value

    @property
    def session_context_file_path(self) -> str:
        if self._source:
            return self._source().session_context_file_path
        return self._session_context_file_path

    @session_context_file_path.setter
    def session_context_file_path(self, value: str) -> None:
        self._session_context_file_path = value

    def snapshot(self) -> ToolContextSnapshot:
        """The current values, copied: what a tool call carries to a worker."""
        if self._source:
            return self._source().model_copy(deep=True)
        return ToolContextSnapshot(
            system_prompt=self._system_prompt,
            session_context=[dict(m) for m in self._session_context],
            session_context_file_path=self._session_context_file_path,
        )
