"""Image references as a task writes them, and as skopeo reads them.

- ``oci:/path/to/layout[:tag]``: a local OCI layout (a folder);
- ``oci-archive:/x.tar[:tag]`` and ``docker-archive:/x.tar[:name:tag]``: an archive;
- anything else is a registry reference, ``python:3.12-slim``, ``ghcr.io/org/image:tag``,
  ``registry:5000/x@sha256:...`` (``docker://`` in front is allowed), pulled with skopeo.

Paths are the sandbox worker's: the image is read where the run's container runs.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from worker.contract.errors import ImageError

Transport = Literal["oci", "oci-archive", "docker-archive", "docker"]
LOCAL_TRANSPORTS: tuple[Transport, ...] = ("oci", "oci-archive", "docker-archive")
#: The longest reference taken (a path and a tag, or a registry name and a digest).
MAX_REFERENCE_CHARS = 1024
#: The registry a reference without a domain names, as docker and skopeo read it.
DEFAULT_REGISTRY = "docker.io"

_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_DOMAIN = (
    r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+|[A-Za-z0-9-]+:[0-9]+|"
    r"[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)+:[0-9]+)"
)
_TAG = r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}"
_DIGEST = r"sha256:[0-9a-f]{64}"
_REGISTRY_REFERENCE = re.compile(
    rf"(?:(?P<domain>{_DOMAIN})/)?(?P<path>{_COMPONENT}(?:/{_COMPONENT})*)"
    rf"(?::(?P<tag>{_TAG}))?(?:@(?P<digest>{_DIGEST}))?"
)
#: Every reference ``parse_reference`` takes, as one pattern (Python's and JSON Schema's): a
#: local transport with an absolute path (no colon in it) and its tag, or a registry name that
#: does not begin like a local transport.
IMAGE_REFERENCE_PATTERN = (
    r"^(?:(?:oci|oci-archive|docker-archive):/[^\x00-\x20\x7f:]*(?::[^\x00-\x20\x7f]*)?|"
    r"(?!(?:oci|oci-archive|docker-archive):)(?:docker://)?"
    rf"(?:{_DOMAIN}/)?{_COMPONENT}(?:/{_COMPONENT})*(?::{_TAG})?(?:@{_DIGEST})?)$"
)
_IMAGE_REFERENCE = re.compile(IMAGE_REFERENCE_PATTERN)


@dataclass(frozen=True, slots=True)
class ImageReference:
    """One image: ``text`` as the task gave it, and where skopeo finds it."""

    text: str
    transport: Transport
    #: A local path, or a registry name (``domain/path``) without tag or digest.
    location: str
    #: The tag of a layout or registry image, the name of an archive's image; None: the only
    #: one (``latest`` for a registry).
    tag: str | None = None
    #: A registry reference that names its digest.
    digest: str | None = None

    @property
    def registry(self) -> str | None:
        """The registry host (``host[:port]``) of a registry reference."""
        if self.transport != "docker":
            return None
        first, _, rest = self.location.partition("/")
        return first if rest and _is_domain(first) else DEFAULT_REGISTRY

    def for_skopeo(self, digest: str | None = None) -> str:
        """The reference in skopeo's words; with ``digest``, a registry image pinned to it, so
        that what is pulled is what was resolved."""
        if self.transport == "docker":
            pinned = digest if digest is not None else self.digest
            if pinned is not None:
                return f"docker://{self.location}@{pinned}"
            return f"docker://{self.location}:{self.tag or 'latest'}"
        suffix = f":{self.tag}" if self.tag else ""
        return f"{self.transport}:{self.location}{suffix}"


def parse_reference(text: str) -> ImageReference:
    """``text`` as an image reference; ``ImageError`` saying what is wrong with it."""
    if not isinstance(text, str) or not text.strip():
        raise ImageError(str(text), "an image reference cannot be empty")
    if len(text) > MAX_REFERENCE_CHARS or any(c <= " " or c == "\x7f" for c in text):
        raise ImageError(
            text[:80],
            "not an image reference (no spaces or control characters, at most 1024 characters)",
        )
    transport, sep, rest = text.partition(":")
    if sep and transport in LOCAL_TRANSPORTS:
        return _local(text, transport, rest)
    registry_text = text.removeprefix("docker://")
    match = _REGISTRY_REFERENCE.fullmatch(registry_text)
    if match is None or _IMAGE_REFERENCE.fullmatch(text) is None:
        raise ImageError(
            text,
            "not an image reference: use oci:/path/to/layout:tag, oci-archive:/x.tar, "
            "docker-archive:/x.tar or a registry name such as python:3.12-slim",
        )
    domain = match["domain"]
    path = match["path"]
    if domain is None and "/" not in path:
        path = f"library/{path}"  # as docker reads "python"
    location = f"{domain or DEFAULT_REGISTRY}/{path}"
    return ImageReference(text, "docker", location, match["tag"], match["digest"])


def _local(text: str, transport: Transport, rest: str) -> ImageReference:
    # skopeo splits a local reference at the first colon after the transport: the path
    # cannot hold one.
    path, _, tag = rest.partition(":")
    if not path.startswith("/"):
        raise ImageError(text, f"the path of a {transport}: image must be absolute")
    return ImageReference(text, transport, path, tag or None)


def _is_domain(component: str) -> bool:
    return component == "localhost" or "." in component or ":" in component
