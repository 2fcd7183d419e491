"""MCP session ids never reach the logs: whoever reads them must not be able to join a session.

An ``Mcp-Session-Id`` is what a session's requests carry besides the token, so a log reader
holding any tenant's token could otherwise act in another's session (the SDK answers it as
unknown, but its logs should not hand it out either). The MCP SDK writes session ids into its
messages at INFO and WARNING; every record of an ``mcp`` logger has them replaced before any
handler, filter or test capture sees it. Session ids are 32 hex digits (``uuid4().hex``).
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any

#: What a session id looks like, inside any text.
SESSION_ID = re.compile(r"(?<![0-9a-fA-F])[0-9a-fA-F]{32}(?![0-9a-fA-F])")
#: What it is replaced with.
HIDDEN = "<session>"
#: The loggers whose records may hold session ids: the MCP SDK's.
SDK_LOGGER = "mcp"

_installed = False
_lock = threading.Lock()


def hide_session_ids() -> None:
    """From now on, records of the MCP SDK's loggers say ``<session>`` where a session id was,
    in their message, arguments and exception text. Installing it twice changes nothing."""
    global _installed
    with _lock:
        if _installed:
            return
        make_record = logging.getLogRecordFactory()

        def hiding(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = make_record(*args, **kwargs)
            if record.name == SDK_LOGGER or record.name.startswith(SDK_LOGGER + "."):
                redact(record)
            return record

        logging.setLogRecordFactory(hiding)
        _installed = True


def redact(record: logging.LogRecord) -> None:
    """Replace every session id in ``record``: the message is formatted here, once, so that no
    argument carries one to a handler."""
    try:
        message = record.getMessage()
    except (TypeError, ValueError):  # arguments that do not fit: keep the template alone
        message = str(record.msg)
    record.msg = SESSION_ID.sub(HIDDEN, message)
    record.args = None
    if record.exc_info and record.exc_info[1] is not None:
        text = logging.Formatter().formatException(record.exc_info)
        record.exc_text = SESSION_ID.sub(HIDDEN, text)
        record.exc_info = None
