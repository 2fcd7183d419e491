"""Whose an MCP session over HTTP is: the tenant whose token opened it, and no one else's.

The SDK's session manager keeps, for each session, the principal that opened it, and answers a
request of any other principal for that session exactly as it answers an unknown session id
(404 "Session not found"), whatever the method: POST, GET or DELETE. toolq makes the tenant of
the request's token that principal (``principal``). The manager is told of each session's end,
however it ends (DELETE, idle timeout, crash, shutdown), so that its run and its place under the
tenant's cap end with it (``OwnedSessions``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp_types import INVALID_REQUEST, ErrorData, JSONRPCError
from starlette.responses import Response
from starlette.types import Message, Receive, Scope

from worker.contract.keys import DEFAULT_TENANT

#: Where the token guard leaves the tenant of a request (``scope["state"]``).
TENANT_STATE = "tenant"


class OwnedSessions(StreamableHTTPSessionManager):
    """The SDK's session manager, telling ``on_end`` each session id it forgets.

    ``_discard_session`` is where the manager forgets a session, for every way one ends; it may
    be called twice for one session, so ``on_end`` must take a session it has seen end already.
    """

    def __init__(self, *args: Any, on_end: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._on_end = on_end

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        try:
            await super()._discard_session(session_id, transport)
        finally:
            self._on_end(session_id)


def tenant_of(scope: Scope) -> str:
    """The tenant the token guard found for this request (the default tenant on an open API)."""
    state = scope.get("state") or {}
    return str(state.get(TENANT_STATE, DEFAULT_TENANT))


def principal(tenant: str) -> AuthenticatedUser:
    """``tenant`` as the principal the SDK compares a session's requests against: two requests
    are the same principal when their tokens are the same tenant's. It holds no token."""
    return AuthenticatedUser(AccessToken(token=f"tenant:{tenant}", client_id=tenant, scopes=[]))


async def read_body(receive: Receive) -> tuple[bytes, Receive]:
    """The request's body, and a ``receive`` that gives the app the same messages again. The
    body is as large as the API's body limit lets it be, at most."""
    messages: list[Message] = []
    chunks: list[bytes] = []
    while True:
        message = await receive()
        messages.append(message)
        if message["type"] != "http.request":
            break
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            break
    replay = iter(messages)

    async def replayed() -> Message:
        for message in replay:
            return message
        return await receive()

    return b"".join(chunks), replayed


def opening_request(body: bytes) -> tuple[bool, Any]:
    """Whether a POST without a session id may open a session, and its JSON-RPC id.

    Only ``initialize`` opens one; a request of the stateless protocol (``server/discover``,
    the 2026-07-28 era) opens none and takes no place. A body that is not one JSON-RPC request
    is counted as opening one: the SDK refuses it, and the place is given back at once.
    """
    try:
        message = json.loads(body)
    except ValueError:
        return True, None
    if not isinstance(message, dict):
        return True, None
    return message.get("method") == "initialize", message.get("id")


def refusal(message: str, request_id: Any, status_code: int) -> Response:
    """A JSON-RPC error for the request ``request_id``, which MCP clients raise as an error
    carrying ``message``."""
    error = JSONRPCError(
        jsonrpc="2.0",
        id=request_id if isinstance(request_id, str | int) else None,
        error=ErrorData(code=INVALID_REQUEST, message=message),
    )
    return Response(
        error.model_dump_json(by_alias=True, exclude_unset=True),
        status_code=status_code,
        media_type="application/json",
    )
