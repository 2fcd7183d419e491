"""Where a run that a token started may take its image from, where a tokens file
(``TOOLQ_API_TOKENS_FILE``) is set: what ``TOOLQ_IMAGE_SOURCES`` names, and where it is unset, a
registry whose every address is public. Never a path of the sandbox worker's host, nor a
loopback, private or link-local address (a registry's name is resolved and each address it has
is looked at), unless the allowlist names it. The operator's own runs (``toolq run``, batches
from the command line, an API without a tokens file) keep what the allowlist alone allows.

Every refusal is the sandbox worker's own line (``worker.contract.image_sources.refusal``): it
says the same whether anything is at the address or path, and nothing is connected to.
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from worker.contract.errors import ImageError
from worker.contract.image_reference import parse_reference
from worker.contract.image_sources import ImageSources, refusal
from worker.contract.settings import FleetSettings

#: The longest a registry's name is given to resolve; past it, the image is refused.
RESOLVE_TIMEOUT_S = 5.0

#: Where a problem is, as a request's validation errors say it.
Location = tuple[str | int, ...]


async def tenant_image_refusal(image: str, sources: ImageSources) -> str | None:
    """The one line refusing ``image`` to a token's run, or None where it may use it."""
    try:
        ref = parse_reference(image)
    except ImageError as exc:
        return str(exc)
    if sources.names(ref):
        return None
    if sources.is_set or ref.transport != "docker" or ref.registry is None:
        return str(refusal(ref))
    host, _, port = ref.registry.partition(":")  # a reference names no IPv6 literal
    if not await _only_public(host, int(port) if port else 443):
        return str(refusal(ref))
    return None


def tenant_vet(settings: FleetSettings) -> Callable[[str], Awaitable[str | None]]:
    """``tenant_image_refusal`` with the fleet's allowlist, for a ``RunEnvironment``."""
    sources = ImageSources.parse(settings.image_sources)
    return lambda image: tenant_image_refusal(image, sources)


async def tenant_image_errors(
    images: Iterable[tuple[Location, str | None]], settings: FleetSettings
) -> list[dict[str, Any]]:
    """Validation errors (as FastAPI's 422 lists them) for each image a token's request names
    that it may not use; each distinct image is looked at once."""
    sources = ImageSources.parse(settings.image_sources)
    named = [(where, image) for where, image in images if image is not None]
    distinct = sorted({image for _, image in named})
    verdicts = dict(
        zip(
            distinct,
            await asyncio.gather(*(tenant_image_refusal(i, sources) for i in distinct)),
            strict=True,
        )
    )
    return [
        {"loc": where, "msg": verdicts[image], "type": "value_error"}
        for where, image in named
        if verdicts[image] is not None
    ]


async def _only_public(host: str, port: int) -> bool:
    """``host`` resolves, and to public addresses alone (a name with one private address among
    public ones is refused: a client may pick any)."""
    loop = asyncio.get_running_loop()
    try:
        found = await asyncio.wait_for(
            loop.getaddrinfo(host, port, type=socket.SOCK_STREAM), RESOLVE_TIMEOUT_S
        )
    except (OSError, TimeoutError, UnicodeError, ValueError, OverflowError):
        return False
    addresses = [str(entry[4][0]) for entry in found]
    return bool(addresses) and all(is_public(address) for address in addresses)


def is_public(address: str) -> bool:
    """``address`` is a public unicast address: not loopback, private, link-local, shared
    (100.64/10), reserved or multicast, an IPv4 address inside IPv6 included."""
    try:
        ip = ipaddress.ip_address(address.partition("%")[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address):
        inner = ip.ipv4_mapped or ip.sixtofour or (ip.teredo[1] if ip.teredo else None)
        if inner is not None:
            return is_public(str(inner))
    return ip.is_global and not ip.is_multicast
