"""The service operations of a run's box: ``toolq.start_environment`` (on any sandbox worker: it
resolves the image, pulls and unpacks it if the cache lacks it, starts the run's box and says
which worker's queue reaches it) and ``toolq.end_environment`` (on that queue).

Models never see them. A bad image is an answer, ``{"ok": false, "error": "image", "message":
"image '...': <cause>"}``, which the caller reports as the item's (or the call's) one line.
"""

from __future__ import annotations

import time
from pathlib import Path

from worker.contract.deadlines import END_ENVIRONMENT_TIMEOUT_MS, START_ENVIRONMENT_TIMEOUT_MS
from worker.contract.errors import ImageError
from worker.contract.operations import (
    END_ENVIRONMENT,
    START_ENVIRONMENT,
    EndEnvironmentAnswer,
    ImageRefusal,
    NoArguments,
    StartEnvironmentAnswer,
    StartEnvironmentRequest,
)
from worker.contract.settings import get_worker_settings
from worker.images.here import worker_boxes
from worker.sandbox import SandboxConfig
from worker.tools.interface import ExecutableTool
from worker.tools.runtime import current_limits, current_runtime
from worker.tools.service import OperationTool


class StartEnvironmentTool(OperationTool[StartEnvironmentRequest]):
    """Start the run's box from an image (or find it started)."""

    operation = START_ENVIRONMENT
    description = "Start the run's container from an image; say which worker holds it."
    # Starting again finds the box started, or starts one where the first start died.
    idempotent = True
    timeout_argument = "timeout_ms"
    default_timeout_ms = START_ENVIRONMENT_TIMEOUT_MS
    # The image's WorkingDir comes into the workspace.
    workspace_effect = "adds"

    def serve(self, request: StartEnvironmentRequest) -> StartEnvironmentAnswer | ImageRefusal:
        deadline = time.monotonic() + request.timeout_ms / 1000
        image = request.image
        workspace = current_runtime().workspace
        try:
            if workspace.owner is None:
                raise ImageError(image, "the run's workspace has no uid of its own here")
            boxes = worker_boxes()
            _note_used(workspace.root, workspace.owner[0], image)
            record = boxes.start(
                workspace.root.name,
                workspace.root,
                workspace.owner,
                image,
                deadline,
                user=request.user,
                env=request.env,
                limits=current_limits(),
            )
        except ImageError as exc:
            message = str(exc) if exc.image else f"image {image!r}: {exc.cause}"
            return ImageRefusal(message=message)
        return StartEnvironmentAnswer(
            environment=record.name,
            image=record.image,
            digest=record.digest,
            worker=record.owner.worker,
            queue=record.owner.queue,
            runtime=record.runtime,
            workdir=record.workdir,
            user=record.user,
            start_ms=record.start_ms,
            pulled=record.pulled,
        )


class EndEnvironmentTool(OperationTool[NoArguments]):
    """End the run's box, if this worker holds one."""

    operation = END_ENVIRONMENT
    description = "End the run's container and remove its writable layer."
    idempotent = True

    def serve(self, request: NoArguments) -> EndEnvironmentAnswer | ImageRefusal:
        run_id = current_runtime().workspace.root.name
        try:
            ended = worker_boxes().end(run_id, time.monotonic() + END_ENVIRONMENT_TIMEOUT_MS / 1000)
        except ImageError as exc:
            return ImageRefusal(message=str(exc))
        return EndEnvironmentAnswer(ended=ended is not None)


def image_tools() -> list[ExecutableTool]:
    """The box's service operations, for a worker's registry: each acts on the running call's
    run."""
    return [StartEnvironmentTool(), EndEnvironmentTool()]


def _note_used(folder: Path, uid: int, image: str) -> None:
    """Before the box's processes run as the run's uid: noted used, so that its release resets
    it (``worker.sandbox.uid_use``)."""
    sandbox = SandboxConfig.from_settings(get_worker_settings())
    try:
        sandbox.note_uid_used(folder, uid)
    except OSError as exc:
        raise ImageError(image, f"the run's uid could not be noted as used: {exc}") from None
