"""What guards the HTTP API: the bearer token (on routes and on ``/mcp``), the listening address,
the body size."""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import Depends, HTTPException
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from pydantic import SecretStr
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="The server's TOOLQ_API_TOKEN, sent as `Authorization: Bearer <token>`.",
)


def token_guard(token: SecretStr | None) -> Callable[..., Awaitable[None]]:
    """A dependency that admits requests bearing ``token``; every request when it is None."""
    expected = token.get_secret_value().encode() if token else None

    async def require_token(
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
    ) -> None:
        refusal = token_refusal(expected, credentials.credentials if credentials else None)
        if refusal is not None:
            raise refusal

    return require_token


def token_refusal(expected: bytes | None, presented: str | None) -> HTTPException | None:
    """Why a request bearing ``presented`` is refused (401), or None when it may pass."""
    if expected is None:
        return None
    if presented is None:
        return HTTPException(
            401,
            "this API needs the header 'Authorization: Bearer <TOOLQ_API_TOKEN>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    if not hmac.compare_digest(presented.encode(), expected):
        return HTTPException(
            401,
            "the bearer token is not this server's TOOLQ_API_TOKEN",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return None


class TokenGuard:
    """The bearer token check in front of an ASGI app that is not a FastAPI route (``/mcp``):
    the same answers as the routes' guard."""

    def __init__(self, app: ASGIApp, token: SecretStr | None) -> None:
        self.app = app
        self._expected = token.get_secret_value().encode() if token else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scheme, credentials = get_authorization_scheme_param(
                Headers(scope=scope).get("authorization")
            )
            presented = credentials if scheme.lower() == "bearer" and credentials else None
            refusal = token_refusal(self._expected, presented)
            if refusal is not None:
                response = JSONResponse(
                    {"detail": refusal.detail}, refusal.status_code, headers=refusal.headers
                )
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(
            413,
            f"the request body is larger than {limit} bytes (TOOLQ_API_MAX_BODY_BYTES)",
        )


class BodySizeLimit:
    """Refuses bodies over ``limit`` bytes with 413, counting the bytes actually received.

    A Content-Length over the limit is refused before anything is read; a body sent without
    one (chunked) or longer than it claims is cut off as soon as it passes the limit.
    ``BodyTooLarge`` is an ``HTTPException``, so a route reading the body answers 413 through
    the app's own exception handling.
    """

    def __init__(self, app: ASGIApp, limit: int) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.limit:
            await _send_413(send, self.limit)
            return
        received = 0

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        started = False

        async def watching_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, watching_send)
        except BodyTooLarge:
            if started:
                raise
            await _send_413(send, self.limit)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", []):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _send_413(send: Send, limit: int) -> None:
    body = BodyTooLarge(limit).detail.encode()
    payload = b'{"detail":"' + body + b'"}'
    await send(
        {
            "type": "http.response.start",
            "status": 413,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(payload)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": payload})
