"""The ids a log line carries: the run and the model's tool call it was written for.

Both floors log under them: the orchestrator around each conversation and call, a worker around
each call it runs. They live in context variables; asyncio tasks and ``asyncio.to_thread`` copy
the context they start in, so whatever a call does logs under its ids.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from contextvars import ContextVar, Token

_run_id: ContextVar[str | None] = ContextVar("toolq_run_id", default=None)
_tool_call_id: ContextVar[str | None] = ContextVar("toolq_tool_call_id", default=None)

#: Fields a record carries from ``log_context`` (or from ``extra=``), in output order.
CONTEXT_FIELDS = ("run_id", "tool_call_id")


@contextlib.contextmanager
def log_context(*, run_id: str | None = None, tool_call_id: str | None = None) -> Iterator[None]:
    """Log lines inside carry these ids; ``None`` keeps whatever the enclosing context set."""
    tokens: list[tuple[ContextVar[str | None], Token[str | None]]] = []
    for variable, value in ((_run_id, run_id), (_tool_call_id, tool_call_id)):
        if value is not None:
            tokens.append((variable, variable.set(value)))
    try:
        yield
    finally:
        for variable, token in reversed(tokens):
            variable.reset(token)


def current_context() -> dict[str, str]:
    """The ids set by the enclosing ``log_context`` blocks."""
    values = {"run_id": _run_id.get(), "tool_call_id": _tool_call_id.get()}
    return {name: value for name, value in values.items() if value is not None}


class ContextFilter(logging.Filter):
    """Stamps each record with the current ids, unless the caller passed them in ``extra``."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in current_context().items():
            if getattr(record, name, None) is None:
                setattr(record, name, value)
        return True


def with_ids(text: str, record: logging.LogRecord) -> str:
    """A formatted record with its ids after the first line: ``message [run_id=...]``, so a
    traceback below it stays as it was."""
    ids = [
        f"{name}={value}"
        for name in CONTEXT_FIELDS
        if (value := getattr(record, name, None)) is not None
    ]
    if not ids:
        return text
    first, newline, rest = text.partition("\n")
    return f"{first} [{' '.join(ids)}]{newline}{rest}"


class WithIds(logging.Formatter):
    """Another formatter's lines, each with the ids of its record (see ``with_ids``)."""

    def __init__(self, inner: logging.Formatter | None) -> None:
        super().__init__()
        self._inner = inner or logging.Formatter()

    def format(self, record: logging.LogRecord) -> str:
        return with_ids(self._inner.format(record), record)


def show_ids(logger: logging.Logger) -> None:
    """Make the handlers of ``logger`` stamp and show the ids: for a host process (a Celery
    worker) that configured its own logging."""
    for handler in logger.handlers:
        if not any(isinstance(f, ContextFilter) for f in handler.filters):
            handler.addFilter(ContextFilter())
        if not isinstance(handler.formatter, WithIds):
            handler.setFormatter(WithIds(handler.formatter))
