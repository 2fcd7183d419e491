"""The two ways a run's image can fail: the image cannot be used, or the run's container is gone.

Both carry one line for the caller: which image, and why. Nothing in this package lets a
traceback reach a caller for bad input.
"""

from __future__ import annotations

from worker.contract.errors import ToolqError


class ImageError(ToolqError, RuntimeError):
    """An image could not be resolved, pulled, unpacked or started; ``str()`` is one line
    naming the image and the cause."""

    def __init__(self, image: str, cause: str) -> None:
        super().__init__(f"image {image!r}: {cause}")
        self.image = image
        self.cause = cause


class EnvironmentLost(ToolqError, RuntimeError):
    """The run's container is gone (its worker died, it was ended, or its workspace was
    removed): nothing of the run's call ran."""
