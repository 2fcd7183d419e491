"""Structured logs: JSON lines off a terminal, readable text on one, with run and call ids.

The ids come from context variables set with ``log_context``
(``worker.plumbing.log_context``: workers log under the same ids); asyncio tasks copy the
context they are created in, so every task a conversation starts logs under its run_id.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import Any, TextIO

from worker.contract.settings import FleetSettings
from worker.plumbing.log_context import (
    CONTEXT_FIELDS,
    ContextFilter,
    current_context,
    log_context,
    with_ids,
)

__all__ = [
    "CONTEXT_FIELDS",
    "ContextFilter",
    "JsonFormatter",
    "TextFormatter",
    "configure_logging",
    "current_context",
    "log_context",
]

#: Libraries that log every request at INFO: a batch of a thousand conversations would drown
#: its own messages in theirs.
CHATTY_LOGGERS = ("httpx", "httpx2", "httpcore", "openai")
#: Where the openai client logs its retries of model requests, at INFO (each request it logs at
#: DEBUG): a model API that keeps failing should show, as toolq's own retries do.
RETRY_LOGGERS = ("openai._base_client",)

# The attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD_ATTRIBUTES = frozenset(
    logging.LogRecord("", 0, "", 0, "", None, None).__dict__.keys()
    | {"message", "asctime", "taskName", *CONTEXT_FIELDS}
    # uvicorn adds a copy of the message with ANSI colours: noise in a JSON line.
    | {"color_message"}
)


class JsonFormatter(logging.Formatter):
    """One JSON object a line: timestamp, level, logger, message, ids, extras, exception."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"
            ),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for name in CONTEXT_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                entry[name] = value
        for name, value in record.__dict__.items():
            if name not in _STANDARD_ATTRIBUTES and not name.startswith("_"):
                entry[name] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        return json.dumps(entry, ensure_ascii=False, default=str)


class TextFormatter(logging.Formatter):
    """``12:00:01.123 WARNING api.batch: message [run_id=...]`` for people at a terminal."""

    def __init__(self) -> None:
        super().__init__(
            "%(asctime)s.%(msecs)03d %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S"
        )

    def format(self, record: logging.LogRecord) -> str:
        return with_ids(super().format(record), record)


class _StderrHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Writes to ``sys.stderr`` as it is at each record: a progress bar that redirects stderr
    (rich does) then prints log lines above itself instead of through itself."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


_HANDLER_MARK = "_toolq_handler"


def wants_json(settings: FleetSettings, stream: TextIO) -> bool:
    if settings.log_format != "auto":
        return settings.log_format == "json"
    return not (hasattr(stream, "isatty") and stream.isatty())


def configure_logging(
    settings: FleetSettings | None = None, *, stream: TextIO | None = None
) -> None:
    """Send the root logger's records to stderr (or ``stream``) in the format that suits it.

    TOOLQ_LOG_FORMAT (auto, json, text) and TOOLQ_LOG_LEVEL choose; calling again replaces the
    handler this installed rather than adding a second one.
    """
    settings = settings or FleetSettings()
    handler: logging.Handler = (
        logging.StreamHandler(stream) if stream is not None else _StderrHandler()
    )
    as_json = wants_json(settings, stream if stream is not None else sys.stderr)
    handler.setFormatter(JsonFormatter() if as_json else TextFormatter())
    handler.addFilter(ContextFilter())
    setattr(handler, _HANDLER_MARK, True)
    root = logging.getLogger()
    for old in [h for h in root.handlers if getattr(h, _HANDLER_MARK, False)]:
        root.removeHandler(old)
    root.addHandler(handler)
    try:
        root.setLevel(settings.log_level.upper())
    except ValueError:
        root.setLevel(logging.INFO)
        logging.getLogger(__name__).warning(
            "TOOLQ_LOG_LEVEL=%s is not a logging level; using INFO", settings.log_level
        )
    for name in CHATTY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
    for name in RETRY_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.INFO, root.level))
