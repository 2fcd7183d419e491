"""What a run says of its image, wherever a run is defined: a batch task line (``BatchItem``)
and a conversation's options (``AgentOptions``, and so the HTTP API's runs) take these fields
alike, checked alike, and described alike in the API's schema."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, Field, StrictBool, field_validator

from worker.contract.errors import ImageError
from worker.contract.image_reference import (
    IMAGE_REFERENCE_PATTERN,
    MAX_REFERENCE_CHARS,
    parse_reference,
)
from worker.contract.variables import settable_variables

#: A user as an image's ``User`` names one: a name or uid, with ``:group`` or ``:gid``.
USER_PATTERN = r"^[^\x00-\x20\x7f:]+(?::[^\x00-\x20\x7f:]+)?$"

#: A variable's name: not empty, no "=" or NUL.
VARIABLE_NAME_PATTERN = r"^[^=\x00]+$"
VariableValue = Annotated[str, Field(json_schema_extra={"pattern": r"^[^\x00]*$"})]


class ImageFields(BaseModel):
    """A run's image and how its container runs (``user``, ``env`` and ``recreate`` apply to
    the container, and to nothing without ``image``)."""

    image: str | None = Field(
        None,
        min_length=1,
        max_length=MAX_REFERENCE_CHARS,
        json_schema_extra={"pattern": IMAGE_REFERENCE_PATTERN},
        description="An OCI image the run's commands run in, one container for the run: "
        "oci:/layout:tag, oci-archive:/x.tar, docker-archive:/x.tar or a registry reference "
        "(python:3.12-slim); the run records its digest.",
    )
    user: str | None = Field(
        None,
        min_length=1,
        max_length=256,
        json_schema_extra={"pattern": USER_PATTERN},
        description="With image: who its commands run as (a name or uid[:gid] of the image), "
        "instead of the image's User.",
    )
    env: Annotated[dict[str, VariableValue], AfterValidator(settable_variables)] | None = Field(
        None,
        description="With image: variables every command of the run gets, over its Env.",
        json_schema_extra={"propertyNames": {"pattern": VARIABLE_NAME_PATTERN}},
    )
    recreate: StrictBool = Field(
        False,
        description="With image: a container lost mid-run (its sandbox worker died) starts "
        "again from the image, instead of the run's next command failing (environment lost). "
        "The workspace is kept; what was outside it (packages installed, files written "
        "elsewhere, processes) is gone, which the answer of the first command in the new "
        "container says.",
    )

    @field_validator("image")
    @classmethod
    def _an_image_reference(cls, image: str | None) -> str | None:
        if image is not None:
            try:
                parse_reference(image)
            except ImageError as exc:
                raise ValueError(str(exc)) from None
        return image

    @field_validator("user")
    @classmethod
    def _a_user(cls, user: str | None) -> str | None:
        if user is not None and not re.fullmatch(USER_PATTERN, user):
            raise ValueError("a user is a name or uid, with :group or :gid, e.g. 1000:1000")
        return user
