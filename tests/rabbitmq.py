"""The RabbitMQ the integration tests use: the one at 127.0.0.1:5672 unless TEST_AMQP_URL
names another. Tests that need it skip, saying why, where none answers."""

from __future__ import annotations

import os
import socket
from urllib.parse import urlsplit

import pytest

AMQP_URL = os.environ.get("TEST_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")


def rabbitmq_unreachable() -> str | None:
    """Why the tests' RabbitMQ cannot be reached, or None when it can."""
    parts = urlsplit(AMQP_URL)
    try:
        with socket.create_connection((parts.hostname or "127.0.0.1", parts.port or 5672), 1):
            return None
    except OSError as exc:
        return f"RabbitMQ is not reachable at {parts.hostname}:{parts.port or 5672}: {exc}"


def require_rabbitmq() -> None:
    """Skip the test, saying why, when the tests' RabbitMQ does not answer."""
    if reason := rabbitmq_unreachable():
        pytest.skip(reason)


def with_wrong_password() -> tuple[str, str]:
    """The tests' RabbitMQ URL with a password it refuses, and that URL as toolq shows it."""
    parts = urlsplit(AMQP_URL)
    where = f"{parts.hostname}:{parts.port or 5672}{parts.path}"
    return f"amqp://{parts.username}:wrong-password@{where}", f"amqp://{parts.username}:**@{where}"
