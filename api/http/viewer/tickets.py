"""Tickets for the viewer's live streams: an EventSource cannot send a bearer token.

A browser's ``EventSource`` sends no ``Authorization`` header, and the token must never be in a
URL. So a page fetched with the token carries, for its one live stream, a ticket: the stream's
path and an expiry, signed with a key derived from the token. Every replica with the same token
checks it without keeping state; it opens that one read-only stream, for a few minutes, and
nothing else.
"""

from __future__ import annotations

import hashlib
import hmac
import time

from pydantic import SecretStr

#: How long a ticket opens its stream; a page that outlives it fetches itself, and a new one.
TICKET_TTL_S = 600


class StreamTickets:
    """Signs and checks tickets for stream paths."""

    def __init__(self, token: SecretStr) -> None:
        self._key = hmac.new(
            token.get_secret_value().encode(), b"toolq viewer stream tickets", hashlib.sha256
        ).digest()

    def mint(self, path: str) -> str:
        expires = int(time.time()) + TICKET_TTL_S
        return f"{expires}.{self._sign(path, expires)}"

    def admits(self, path: str, ticket: str | None) -> bool:
        if not ticket or "." not in ticket:
            return False
        expires_text, signature = ticket.split(".", 1)
        if not expires_text.isdigit() or int(expires_text) < time.time():
            return False
        return hmac.compare_digest(signature, self._sign(path, int(expires_text)))

    def _sign(self, path: str, expires: int) -> str:
        message = f"{path}\n{expires}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()
