"""Image references: what is taken, how skopeo is told, and one line for what is not."""

from __future__ import annotations

import re

import pytest

from worker.contract.errors import ImageError
from worker.contract.image_reference import IMAGE_REFERENCE_PATTERN, parse_reference

DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize(
    ("text", "skopeo", "registry"),
    [
        ("python:3.12-slim", "docker://docker.io/library/python:3.12-slim", "docker.io"),
        ("busybox", "docker://docker.io/library/busybox:latest", "docker.io"),
        ("ghcr.io/org/env:1", "docker://ghcr.io/org/env:1", "ghcr.io"),
        (f"ghcr.io/org/env@{DIGEST}", f"docker://ghcr.io/org/env@{DIGEST}", "ghcr.io"),
        ("127.0.0.1:5000/t/a:v1", "docker://127.0.0.1:5000/t/a:v1", "127.0.0.1:5000"),
        ("localhost/a", "docker://localhost/a:latest", "localhost"),
        ("docker://quay.io/x/y:z", "docker://quay.io/x/y:z", "quay.io"),
        ("oci:/srv/layout:v2", "oci:/srv/layout:v2", None),
        ("oci:/srv/layout", "oci:/srv/layout", None),
        ("oci-archive:/srv/x.tar", "oci-archive:/srv/x.tar", None),
        ("docker-archive:/srv/x.tar:repo:tag", "docker-archive:/srv/x.tar:repo:tag", None),
    ],
)
def test_references_are_taken_and_told_to_skopeo(
    text: str, skopeo: str, registry: str | None
) -> None:
    ref = parse_reference(text)
    assert ref.for_skopeo() == skopeo
    assert ref.registry == registry
    assert re.fullmatch(IMAGE_REFERENCE_PATTERN, text)  # the schema says the same


def test_a_registry_image_is_pulled_by_the_digest_it_resolved_to() -> None:
    ref = parse_reference("python:3.12-slim")
    assert ref.for_skopeo(DIGEST) == f"docker://docker.io/library/python@{DIGEST}"


@pytest.mark.parametrize(
    ("text", "cause"),
    [
        ("", "cannot be empty"),
        ("python 3", "no spaces"),
        ("a\x00b", "no spaces or control characters"),
        ("Python:3", "not an image reference"),
        ("oci:relative/layout", "must be absolute"),
        ("x" * 2000, "at most 1024 characters"),
    ],
)
def test_what_is_no_reference_is_one_line_naming_it(text: str, cause: str) -> None:
    with pytest.raises(ImageError) as raised:
        parse_reference(text)
    message = str(raised.value)
    assert message.startswith("image '") and cause in message and "\n" not in message
    # The schema says the same: by the pattern, or by its maxLength.
    assert len(text) > 1024 or not re.fullmatch(IMAGE_REFERENCE_PATTERN, text)
