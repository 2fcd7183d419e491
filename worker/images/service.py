"""The service operations of a run's box: ``toolq.start_environment`` (on any sandbox worker: it
resolves the image, pulls and unpacks it if the cache lacks it, starts the run's box and says
which worker's queue reaches it) and ``toolq.end_environment`` (on that queue).

Models never see them. A bad image is an answer, ``{"ok": false, "error": "image", "message":
"image '...': <cause>"}``, which the caller reports as the item's (or the call's) one line.
"""

from __future__ import annotations

import time
from typing import Any

from pydantic import Field, field_validator

from worker.contract.image_errors import ImageError
from worker.images.here import worker_boxes
from worker.tools.interface import ExecutableTool, ToolArgs
from worker.tools.runtime import current_runtime
from worker.tools.workspace import Workspace

#: A start's time limit when the caller gives none: a first pull of a large image is slow.
START_TIMEOUT_MS = 300_000


class StartEnvironmentArgs(ToolArgs):
    image: str = Field(
        min_length=1,
        max_length=1024,
        description="oci:/layout:tag, oci-archive:/x.tar, docker-archive:/x.tar, or a registry "
        "reference (python:3.12-slim, ghcr.io/org/x@sha256:...).",
    )
    user: str | None = Field(
        None, description="Who commands run as (name or uid[:gid]); default the image's User."
    )
    env: dict[str, str] = Field(
        default_factory=dict, description="Variables set over the image's Env."
    )
    timeout_ms: int = Field(START_TIMEOUT_MS, gt=0)

    @field_validator("env")
    @classmethod
    def _valid_variables(cls, env: dict[str, str]) -> dict[str, str]:
        for name, value in env.items():
            if not name or "=" in name or "\x00" in name or "\x00" in value:
                raise ValueError(f"{name!r} is not a valid variable (no '=' or NUL, not empty)")
        return env


class StartEnvironmentTool(ExecutableTool):
    """Start the run's box from an image (or find it started)."""

    name = "toolq.start_environment"
    description = "Start the run's container from an image; say which worker holds it."
    Args = StartEnvironmentArgs
    pool = "sandbox"
    # Starting again finds the box started, or starts one where the first start died.
    idempotent = True
    caps_own_output = True
    for_model = False
    timeout_argument = "timeout_ms"
    default_timeout_ms = START_TIMEOUT_MS
    # The image's WorkingDir comes into the workspace.
    workspace_effect = "adds"

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        deadline = time.monotonic() + args["timeout_ms"] / 1000
        image = args["image"]
        workspace = current_runtime().workspace
        try:
            if workspace.owner is None:
                raise ImageError(image, "the run's workspace has no uid of its own here")
            boxes = worker_boxes()
            record = boxes.start(
                workspace.root.name,
                workspace.root,
                workspace.owner,
                image,
                deadline,
                user=args.get("user"),
                env=args.get("env") or {},
            )
        except ImageError as exc:
            message = str(exc) if exc.image else f"image {image!r}: {exc.cause}"
            return {"ok": False, "error": "image", "message": message}
        return {
            "ok": True,
            "environment": record.name,
            "image": record.image,
            "digest": record.digest,
            "worker": record.owner.worker,
            "queue": record.owner.queue,
            "runtime": record.runtime,
            "workdir": record.workdir,
            "user": list(record.user),
            "start_ms": record.start_ms,
            "pulled": record.pulled,
        }


class EndEnvironmentTool(ExecutableTool):
    """End the run's box, if this worker holds one."""

    name = "toolq.end_environment"
    description = "End the run's container and remove its writable layer."
    pool = "sandbox"
    idempotent = True
    caps_own_output = True
    for_model = False

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        run_id = current_runtime().workspace.root.name
        try:
            ended = worker_boxes().end(run_id, time.monotonic() + 30)
        except ImageError as exc:
            return {"ok": False, "error": "image", "message": str(exc)}
        return {"ok": True, "ended": ended is not None}


def image_tools(workspace: Workspace) -> list[ExecutableTool]:
    """The box's service operations, for a worker's registry."""
    return [StartEnvironmentTool(workspace), EndEnvironmentTool(workspace)]
