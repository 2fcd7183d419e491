"""Where a call's command runs: in its run's box when the run has an image (the call names the
box), else on the worker's own file system, as ``run_sandboxed`` runs it."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Unpack

from worker.contract.errors import EnvironmentLost, ImageError
from worker.images.boxes import Boxes, BoxRecord
from worker.images.calls import run_in_box
from worker.images.here import worker_boxes
from worker.sandbox import CommandCall, SandboxResult, run_sandboxed
from worker.tools.runtime import current_environment, current_network


def run_command(command: str | Sequence[str], **call: Unpack[CommandCall]) -> SandboxResult:
    """``run_sandboxed``'s contract, in the run's box when the current call names one.
    ``EnvironmentLost`` when it names a box this worker does not hold (any more)."""
    environment = current_environment()
    network = call.get("network") or current_network()
    if environment is None:
        call["network"] = network
        return run_sandboxed(command, **call)
    boxes, record = run_box(call["home"], environment)
    return run_in_box(
        boxes,
        record,
        command,
        cwd=call["cwd"],
        env=call["env"],
        timeout_ms=call["timeout_ms"],
        config=call["config"],
        stdin=call.get("stdin"),
        before_start=call.get("before_start"),
        network=network,
    )


def run_box(home: Path, environment: str) -> tuple[Boxes, BoxRecord]:
    """The box ``environment`` of the run whose workspace is ``home``, as this worker holds it;
    ``EnvironmentLost`` when it holds none (any more)."""
    try:
        boxes = worker_boxes()
    except ImageError as exc:
        raise EnvironmentLost(exc.cause) from None
    record = boxes.find(home.name)
    if record is None or record.name != environment or record.workspace != str(home):
        raise EnvironmentLost(
            f"this worker holds no container of run {home.name} (it was ended, or its worker "
            "stopped and another took the call)"
        )
    return boxes, record
