"""Where a run's image may come from: ``TOOLQ_IMAGE_SOURCES``, the operator's allowlist, read by
the sandbox workers (which refuse any other source before they connect or open a file) and by
the orchestrator (which holds runs a token started to it, ``api.images.sources``).

Each entry is one of:

- ``host[:port][/path]``: a registry, or only the repositories below ``path`` in it
  (``ghcr.io/acme``). Docker Hub is ``docker.io``: ``python:3.12`` is
  ``docker.io/library/python``. A port is part of the name: ``registry.local`` does not name
  ``registry.local:5000``.
- ``oci:/folder``, ``oci-archive:/folder``, ``docker-archive:/folder``: images of that kind
  below a folder of the sandbox worker's (its links followed: a link out of it is outside).

Unset, every source is allowed, as before the setting existed; a refused one is always the same
line (``refusal``), which says nothing of what is at the refused address or path.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterable
from dataclasses import dataclass

from worker.contract.errors import ImageError
from worker.contract.image_reference import LOCAL_TRANSPORTS, ImageReference

#: The setting, as messages name it.
SOURCES_VARIABLE = "TOOLQ_IMAGE_SOURCES"
_HOST = r"(?:localhost|[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*)(?::[0-9]{1,5})?"
_PATH = r"[a-z0-9]+(?:[._/-]+[a-z0-9]+)*"
_REGISTRY_ENTRY = re.compile(rf"^(?:docker://)?(?P<host>{_HOST})(?:/(?P<path>{_PATH}))?/?$")


@dataclass(frozen=True, slots=True)
class RegistrySource:
    """A registry (``host[:port]``, lowercase), or its repositories below ``path``."""

    host: str
    path: str = ""

    def names(self, ref: ImageReference) -> bool:
        if ref.transport != "docker" or (ref.registry or "").lower() != self.host:
            return False
        repository = ref.location.partition("/")[2]
        return not self.path or is_below(repository, self.path)

    def __str__(self) -> str:
        return f"{self.host}/{self.path}" if self.path else self.host


@dataclass(frozen=True, slots=True)
class FolderSource:
    """Images of one local transport below ``folder`` (absolute, normalised)."""

    transport: str
    folder: str

    def names(self, ref: ImageReference) -> bool:
        return ref.transport == self.transport and is_below(
            posixpath.normpath(ref.location), self.folder
        )

    def __str__(self) -> str:
        return f"{self.transport}:{self.folder}"


Source = RegistrySource | FolderSource


@dataclass(frozen=True, slots=True)
class ImageSources:
    """The allowlist; empty: unset, every source allowed."""

    entries: tuple[Source, ...] = ()

    @classmethod
    def parse(cls, texts: Iterable[str]) -> ImageSources:
        """The entries ``texts`` give; ``ValueError`` (one line) naming one it cannot read."""
        return cls(tuple(parse_source(text) for text in texts if text.strip()))

    @property
    def is_set(self) -> bool:
        return bool(self.entries)

    def names(self, ref: ImageReference) -> bool:
        """An entry names ``ref``'s registry or folder (by its words alone: links in a path
        are the sandbox worker's to follow)."""
        return any(entry.names(ref) for entry in self.entries)

    def folders(self, ref: ImageReference) -> list[str]:
        """The folders of the entries that name ``ref`` (a local image)."""
        return [e.folder for e in self.entries if isinstance(e, FolderSource) and e.names(ref)]


def parse_source(text: str) -> Source:
    """One entry of ``TOOLQ_IMAGE_SOURCES``; ``ValueError`` saying what is wrong with it."""
    entry = text.strip()
    transport, sep, rest = entry.partition(":")
    if sep and transport in LOCAL_TRANSPORTS:
        if not rest.startswith("/") or "\x00" in rest:
            raise ValueError(
                f"{SOURCES_VARIABLE}: {entry!r} must name an absolute folder, "
                f"e.g. {transport}:/srv/images"
            )
        return FolderSource(transport, posixpath.normpath(rest))
    match = _REGISTRY_ENTRY.fullmatch(entry)
    if match is None:
        raise ValueError(
            f"{SOURCES_VARIABLE}: {entry!r} is neither a registry (host[:port][/path], e.g. "
            "ghcr.io/acme) nor a folder (oci:/srv/images, oci-archive:/..., docker-archive:/...)"
        )
    return RegistrySource(match["host"].lower(), match["path"] or "")


def refusal(ref: ImageReference) -> ImageError:
    """The one line every refused source gets, whatever is (or is not) there."""
    return ImageError(
        ref.text, f"not a source this fleet takes images from ({SOURCES_VARIABLE} names those)"
    )


def is_below(path: str, folder: str) -> bool:
    """``path`` is ``folder`` or below it, component by component."""
    return folder == "/" or path == folder or path.startswith(folder.rstrip("/") + "/")
