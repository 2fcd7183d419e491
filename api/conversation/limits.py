"""A conversation's time and token limits: when one is reached, the conversation ends with a
closing answer that says which, instead of an error."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from api.conversation.events import StopReason
from worker.contract.errors import ToolqError

_T = TypeVar("_T")


class LimitReached(ToolqError):
    """A limit ended the conversation; ``message`` is its closing answer."""

    def __init__(self, reason: StopReason, message: str) -> None:
        super().__init__(message)
        self.reason: StopReason = reason
        self.message = message


class ConversationLimits:
    """The wall time and the tokens one conversation may use; either may be unset."""

    def __init__(self, time_limit_s: float | None, token_limit: int | None) -> None:
        self.time_limit_s = time_limit_s
        self.token_limit = token_limit
        self._deadline: float | None = None

    def start(self) -> None:
        """The clock starts with the user's message."""
        if self.time_limit_s is not None:
            self._deadline = asyncio.get_running_loop().time() + self.time_limit_s

    def check_tokens(self, used: int) -> None:
        """Before a model request: past the token limit, no request is sent."""
        if self.token_limit is not None and used >= self.token_limit:
            raise LimitReached(
                "token_limit",
                f"Stopped: the token limit of {self.token_limit:,} tokens was reached "
                f"({used:,} used) before the model gave a final answer.",
            )

    async def within(self, step: Awaitable[_T]) -> _T:
        """``step``'s result, unless the time limit passes first (``LimitReached``).

        Only an await may be bounded this way, never a span that yields to a caller: the limit
        cancels the task that awaits.
        """
        if self._deadline is None:
            return await step
        try:
            async with asyncio.timeout_at(self._deadline) as scope:
                return await step
        except TimeoutError:
            if not scope.expired():
                raise  # a timeout of the step's own
            raise LimitReached(
                "time_limit",
                f"Stopped: the time limit of {self.time_limit_s:g} s was reached before the "
                "model gave a final answer.",
            ) from None
