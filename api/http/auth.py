"""What guards the HTTP API: the bearer tokens (on routes and on ``/mcp``), who each one is, the
listening address, the body size."""

from __future__ import annotations

from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.http.services import Svc
from api.http.tenants import Tenants
from worker.contract.errors import ToolqError
from worker.contract.keys import DEFAULT_TENANT

bearer_scheme = HTTPBearer(
    auto_error=False,
    scheme_name="bearer",
    description="The server's TOOLQ_API_TOKEN, or a token of its TOOLQ_API_TOKENS_FILE, sent as "
    "`Authorization: Bearer <token>`. Each token sees the runs and batches it started, and no "
    "others.",
)


async def require_tenant(
    request: Request,
    services: Svc,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer_scheme)],
) -> str:
    """The tenant whose token the request bears (401 when it bears none of them); the default
    tenant when the API has no token. Kept in ``request.state.tenant`` for the viewer's pages."""
    tenant = tenant_or_refusal(services.tenants, credentials.credentials if credentials else None)
    if isinstance(tenant, HTTPException):
        raise tenant
    request.state.tenant = tenant
    return tenant


#: A route's parameter of this type is the caller's tenant (and the route is behind the tokens).
Tenant = Annotated[str, Depends(require_tenant)]


def tenant_or_refusal(tenants: Tenants, presented: str | None) -> str | HTTPException:
    """The tenant of a request bearing ``presented``, or why it is refused (401)."""
    if tenants.is_open:
        return DEFAULT_TENANT
    if presented is None:
        return HTTPException(
            401,
            f"this API needs the header 'Authorization: Bearer <{tenants.which_token}>'",
            headers={"WWW-Authenticate": "Bearer"},
        )
    tenant = tenants.identify(presented)
    if tenant is None:
        return HTTPException(
            401,
            f"the bearer token is not this server's {tenants.which_token}",
            headers={"WWW-Authenticate": 'Bearer error="invalid_token"'},
        )
    return tenant


class TokenGuard:
    """The bearer token check in front of an ASGI app that is not a FastAPI route (``/mcp``):
    the same answers as the routes' guard; any tenant's token lets a request in, and the app
    finds its tenant in ``scope["state"]["tenant"]``."""

    def __init__(self, app: ASGIApp, tenants: Tenants) -> None:
        self.app = app
        self._tenants = tenants

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scheme, credentials = get_authorization_scheme_param(
                Headers(scope=scope).get("authorization")
            )
            presented = credentials if scheme.lower() == "bearer" and credentials else None
            refusal = tenant_or_refusal(self._tenants, presented)
            if isinstance(refusal, HTTPException):
                response = JSONResponse(
                    {"detail": refusal.detail}, refusal.status_code, headers=refusal.headers
                )
                await response(scope, receive, send)
                return
            # Where the app behind finds whose request it is, as a route's request.state.tenant.
            scope.setdefault("state", {})["tenant"] = refusal
        await self.app(scope, receive, send)


class BodyTooLarge(ToolqError, HTTPException):
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
        declared = Headers(scope=scope).get("content-length", "")
        if declared.isdecimal() and int(declared) > self.limit:
            await _refuse(scope, receive, send, self.limit)
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
            await _refuse(scope, receive, send, self.limit)


async def _refuse(scope: Scope, receive: Receive, send: Send, limit: int) -> None:
    detail = BodyTooLarge(limit).detail
    response = JSONResponse({"detail": detail}, 413, headers={"Connection": "close"})
    await response(scope, receive, send)
