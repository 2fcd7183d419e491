"""Getting an image with the real tools: skopeo resolves its digest and copies it into a local
OCI layout, whose layers are then unpacked one by one (``worker.images.unpack``).

Whatever they refuse becomes one ``ImageError`` line: an unknown reference, a registry that
refuses or cannot be reached, a layout or archive that is missing or corrupt.
"""

from __future__ import annotations

import hashlib
import json
import re
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from worker.contract.errors import ImageError
from worker.contract.image_reference import ImageReference
from worker.exceptions import RegistryUnreachable

#: The tag an image has in the layout it is copied into.
LAYOUT_TAG = "image"
#: The most of a tool's complaint quoted in an error.
_DETAIL_CHARS = 300
#: What skopeo says, and what it means for the image.
_UNREACHABLE = (
    "connection refused",
    "no such host",
    "i/o timeout",
    "network is unreachable",
    "no route to host",
    "server gave http response to https client",
    "x509:",
    "tls:",
    "context deadline exceeded",
    "timeout awaiting response",
    "500 internal server error",
    "502 bad gateway",
    "503 service unavailable",
    "504 gateway timeout",
)
_REFUSED = ("unauthorized", "authentication required", "denied", "forbidden", "toomanyrequests")
_UNKNOWN = ("manifest unknown", "name unknown", "no descriptor found", "not found")
_FATAL_MESSAGE = re.compile(r'msg="(?P<msg>(?:[^"\\]|\\.)*)"')


@dataclass(frozen=True, slots=True)
class Tools:
    """How skopeo reaches the registries, and how a copied image's layers are unpacked."""

    auth_file: Path | None = None
    insecure_registries: tuple[str, ...] = ()

    def resolve(self, ref: ImageReference, deadline: float) -> str:
        """The image's digest (of its manifest, or of its index for a multi-platform image):
        what the run records, and what is pulled."""
        flags = self._source_flags(ref, "")
        raw = _skopeo(ref, ["inspect", "--raw", *flags, ref.for_skopeo()], deadline)
        try:
            json.loads(raw)
        except ValueError:
            raise ImageError(ref.text, "its manifest is not JSON (corrupt layout?)") from None
        return f"sha256:{hashlib.sha256(raw).hexdigest()}"

    def copy(self, ref: ImageReference, digest: str, layout: Path, deadline: float) -> None:
        """The image, as resolved, into the OCI layout ``layout`` (tagged ``LAYOUT_TAG``)."""
        source = ref.for_skopeo(digest if ref.transport == "docker" else None)
        _skopeo(
            ref,
            [
                "copy",
                "--quiet",
                "--remove-signatures",
                *self._source_flags(ref, "src-"),
                source,
                f"oci:{layout}:{LAYOUT_TAG}",
            ],
            deadline,
        )

    def unpack_layer(
        self, ref: ImageReference, number: int, layer: LayerBlob, target: Path, deadline: float
    ) -> None:
        """The image's ``number``-th layer (bottom first) into the empty folder ``target``, in
        overlayfs's form (``worker.images.unpack``)."""
        from worker.images.unpack import unpack_layer

        unpack_layer(
            ref.text, number, layer.media_type, layer.blob, layer.diff_id, target, deadline
        )

    def _source_flags(self, ref: ImageReference, prefix: str) -> list[str]:
        if ref.transport != "docker":
            return []
        flags = []
        if self.auth_file is not None:
            flags.append(f"--{prefix}authfile={self.auth_file}")
        if ref.registry in self.insecure_registries:
            flags.append(f"--{prefix}tls-verify=false")
        return flags


def image_manifest(layout: Path) -> dict[str, Any]:
    """The manifest of the image tagged ``LAYOUT_TAG`` in the layout skopeo wrote."""
    for manifest in _read_json(layout / "index.json").get("manifests") or []:
        annotations = manifest.get("annotations") or {}
        if annotations.get("org.opencontainers.image.ref.name") == LAYOUT_TAG:
            return _read_json(layout_blob(layout, manifest["digest"]))
    raise ValueError("the copied layout has no image tagged for toolq")


def image_config(layout: Path) -> dict[str, Any]:
    """The image's configuration (``config`` of the OCI image config: Env, User, WorkingDir,
    Cmd...) from the layout skopeo wrote; {} when it sets none."""
    manifest = image_manifest(layout)
    config = _read_json(layout_blob(layout, manifest["config"]["digest"]))
    inner = config.get("config") or {}
    return inner if isinstance(inner, dict) else {}


@dataclass(frozen=True, slots=True)
class LayerBlob:
    """One layer of a copied image: how it is compressed, its blob, and its diff id (the digest
    of its uncompressed tar, as the image's configuration gives it)."""

    media_type: str
    blob: Path
    diff_id: str
    #: The blob's digest, as the manifest names it.
    digest: str


def image_layers(layout: Path) -> list[LayerBlob]:
    """The layers of the image tagged ``LAYOUT_TAG`` in ``layout``, bottom first; ``ValueError``
    (or ``KeyError``, ``TypeError``) when its manifest and configuration disagree."""
    manifest = image_manifest(layout)
    config = _read_json(layout_blob(layout, manifest["config"]["digest"]))
    layers = manifest.get("layers") or []
    diff_ids = (config.get("rootfs") or {}).get("diff_ids") or []
    if len(diff_ids) != len(layers):
        raise ValueError(
            f"its manifest has {len(layers)} layers and its configuration {len(diff_ids)} diff ids"
        )
    found = []
    for layer, diff_id in zip(layers, diff_ids, strict=True):
        if not re.fullmatch(r"sha256:[0-9a-f]{64}", str(diff_id)):
            raise ValueError(f"not a sha256 diff id: {diff_id!r}")
        digest = str(layer["digest"])
        found.append(
            LayerBlob(str(layer["mediaType"]), layout_blob(layout, digest), str(diff_id), digest)
        )
    return found


def layout_blob(layout: Path, digest: str) -> Path:
    """Where the blob of ``digest`` is in ``layout``; ``ValueError`` for anything but a digest."""
    algorithm, _, value = str(digest).partition(":")
    if not re.fullmatch(r"[a-z0-9]+", algorithm) or not re.fullmatch(r"[0-9a-f]+", value):
        raise ValueError(f"not a digest: {digest!r}")
    return layout / "blobs" / algorithm / value


def _read_json(path: Path) -> dict[str, Any]:
    data = json.loads(path.read_bytes())
    if not isinstance(data, dict):
        raise ValueError(f"{path.name} is not a JSON object")
    return data


def _skopeo(ref: ImageReference, arguments: list[str], deadline: float) -> bytes:
    binary = shutil.which("skopeo")
    if binary is None:
        raise ImageError(
            ref.text, "skopeo is not installed on the sandbox worker (Debian's skopeo package)"
        )
    left = deadline - time.monotonic()
    if left <= 0:
        raise ImageError(ref.text, "no time was left to fetch it")
    try:
        done = subprocess.run(
            [binary, *arguments],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            timeout=left,
            check=False,
        )
    except subprocess.TimeoutExpired:
        late = f"skopeo did not finish in time ({left:.0f} s)"
        if ref.transport == "docker":
            raise RegistryUnreachable(
                ref.text, f"the registry {ref.registry} did not answer: {late}"
            ) from None
        raise ImageError(ref.text, late) from None
    except OSError as exc:
        raise ImageError(ref.text, f"skopeo could not run: {exc}") from None
    if done.returncode != 0:
        why = cause(ref, done.stderr.decode("utf-8", "replace"))
        if why.startswith(f"the registry {ref.registry} cannot be reached"):
            raise RegistryUnreachable(ref.text, why)
        raise ImageError(ref.text, why)
    return done.stdout


def cause(ref: ImageReference, stderr: str) -> str:
    """What a tool's complaint means for ``ref``, with the complaint's own words at the end."""
    detail = _detail(stderr)
    lowered = detail.lower()
    if ref.transport == "docker":
        if any(word in lowered for word in _UNREACHABLE):
            return f"the registry {ref.registry} cannot be reached: {detail}"
        if any(word in lowered for word in _REFUSED):
            return f"the registry {ref.registry} refused the pull: {detail}"
        if any(word in lowered for word in _UNKNOWN):
            return f"unknown reference (the registry has no such image or tag): {detail}"
        return f"skopeo could not fetch it: {detail}"
    if "no such file or directory" in lowered and "/blobs/" not in detail:
        return f"{ref.location} does not exist on the sandbox worker: {detail}"
    if "no descriptor found" in lowered:
        return f"unknown reference (the layout has no such tag): {detail}"
    return f"the {ref.transport} image is corrupt or unreadable: {detail}"


def _detail(stderr: str) -> str:
    """skopeo's message without its log prefix and the reference it repeats."""
    messages = [m["msg"].replace('\\"', '"') for m in _FATAL_MESSAGE.finditer(stderr)]
    text = messages[-1] if messages else stderr.strip().splitlines()[-1] if stderr.strip() else ""
    text = re.sub(r'^Error parsing image name "[^"]*": ', "", text)
    text = " ".join(text.split())
    return text[:_DETAIL_CHARS] or "no message"
