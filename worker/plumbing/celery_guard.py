"""What every toolq Celery worker checks before Celery reads a message: the tool pools' workers
and the agents workers (``api/agents/``) alike."""

from __future__ import annotations

from typing import Any

from celery.exceptions import InvalidTaskError
from celery.worker.request import Request


class ValidatedRequest(Request):  # type: ignore[misc]
    """Refuses a message whose body is not Celery's (args, kwargs, embed) before Celery reads it.

    Celery unpacks the body unguarded: a JSON string in its place stops the whole worker with
    "Unrecoverable error". Raising InvalidTaskError here makes it log and drop just that message.
    """

    def __init__(self, message: Any, *args: Any, **kwargs: Any) -> None:
        body = message.payload
        if not (
            isinstance(body, list | tuple)
            and len(body) == 3
            and isinstance(body[0], list | tuple)
            and isinstance(body[1], dict)
        ):
            raise InvalidTaskError(f"message body is not [args, kwargs, embed]: {body!r:.200}")
        super().__init__(message, *args, **kwargs)
