"""Case 12: a run's container from an image, in process, as a sandbox worker runs it: the
first call of a run on a warm cache (the container started, then its command), each later call
(an exec into it), next to today's run_bash on the worker's own files (``run_sandboxed``).

The image is a busybox one built here with umoci (as the tests build theirs); the cache is warm
(pulled and unpacked once before the timings), as a worker's is for every run after an image's
first. Each runtime found on PATH is measured: runc, and runsc (gVisor). Beside them, the
shared-base pair (``bench.shared_base``): an image's cold start, and that of an image adding
1 KB to it once its base is cached.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
from collections.abc import Iterator
from functools import partial
from pathlib import Path
from typing import Any

from bench.box_sessions import exec_and_session_ms
from bench.shared_base import fresh_boxes, shared_base_pair
from bench.stats import CaseResult, Comparison, summarize
from tests.worker.images.builders import build_image, images_folder, skip_reason
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.images.boxes import Boxes, BoxRecord
from worker.images.calls import run_in_box
from worker.sandbox import SandboxConfig, run_sandboxed
from worker.tools.factory import prepare_workspace

#: The goal: the first call of a run on a warm cache, container started and command run.
FIRST_CALL_GOAL_MS = 300.0
RUNTIMES = ("runc", "runsc")
TIMEOUT_MS = 10_000


def images_case(runs: int, calls: int) -> CaseResult:
    """``runs`` containers started (and their first call), ``calls`` execs into one, per
    runtime; ``calls`` run_bash 'true' on the worker's own files as the baseline."""
    result = CaseResult(
        key="images",
        title="12. A run's container from an image: start, first call and exec (warm cache)",
    )
    reason = skip_reason()
    if reason is not None:
        result.notes.append(f"not measured: {reason}")
        return result
    with images_folder() as root:
        image = build_image(root / "layout", "bench", name="toolq-bench")
        workspaces = root / "workspaces"
        workspaces.mkdir()
        os.chmod(workspaces, 0o711)
        sandbox = SandboxConfig(
            SandboxSettings(uid_range=str(UidRange.parse(DEFAULT_UID_RANGE))),
            workspace_root=str(workspaces),
        )
        baseline = _run_bash_ms(sandbox, workspaces, calls)
        result.figures["run_bash_true"] = summarize(baseline)
        result.samples_ms["run_bash 'true' (today's sandbox)"] = baseline
        against_run_bash = partial(
            Comparison,
            baseline=result.figures["run_bash_true"]["p50_ms"],
            baseline_name="run_bash 'true' on the worker's files",
            unit="ms",
        )
        for runtime in RUNTIMES:
            if shutil.which(runtime) is None:
                result.notes.append(f"{runtime} not measured: it is not installed")
                continue
            starts, firsts, execs, typed, first_typed = _measure(
                root, runtime, image, sandbox, runs, calls
            )
            figures: dict[str, Any] = {
                "container_start": summarize(starts),
                "first_call": summarize(firsts),
                "exec_true": summarize(execs),
            }
            result.figures[runtime] = figures
            result.samples_ms[f"{runtime}: first call (start + exec)"] = firsts
            result.samples_ms[f"{runtime}: exec 'true'"] = execs
            if typed:
                figures["bash_session_true"] = summarize(typed)
                figures["bash_session_first_call_ms"] = round(first_typed, 2)
                result.samples_ms[f"{runtime}: bash_session 'true'"] = typed
                result.comparisons.append(
                    Comparison(
                        metric=f"{runtime}: bash_session 'true' typed into the container's shell "
                        "(p50)",
                        value=figures["bash_session_true"]["p50_ms"],
                        baseline=figures["exec_true"]["p50_ms"],
                        baseline_name=f"{runtime}: exec 'true' into the same container",
                        unit="ms",
                    )
                )
            result.comparisons += [
                against_run_bash(
                    metric=f"{runtime}: a run's first call, container started (p50)",
                    value=figures["first_call"]["p50_ms"],
                    goal=FIRST_CALL_GOAL_MS if runtime == "runc" else None,
                    goal_on="value",
                ),
                against_run_bash(
                    metric=f"{runtime}: a later call, exec 'true' into the container (p50)",
                    value=figures["exec_true"]["p50_ms"],
                ),
            ]
        if shutil.which("runc") is not None:
            shared_base_pair(result, root, "runc", max(2, runs // 3), sandbox)
    result.notes.append(
        "In process, no queue: the pool's round trip comes on top of each, as for run_bash "
        "(case 4). A container's start is its root's idmapped mount and overlay, the runtime's "
        "create and start; each call is one `exec` of the runtime, then its leftovers killed."
    )
    return result


def _measure(
    root: Path, runtime: str, image: str, sandbox: SandboxConfig, runs: int, calls: int
) -> tuple[list[float], list[float], list[float], list[float], float]:
    """Each run's container start and first call; then, on one container, execs alternated
    with session calls (runc alone: gVisor holds no session), and the session's first call."""
    with _boxes(root, runtime) as boxes:
        # Warm: the image pulled and unpacked once.
        _start(boxes, sandbox, root, "warm", image)
        boxes.end("warm", time.monotonic() + 30)
        starts, firsts = [], []
        for n in range(runs):
            run_id = f"bench-{runtime}-{n}"
            began = time.perf_counter()
            record, workspace, _ = _start(boxes, sandbox, root, run_id, image)
            started = time.perf_counter()
            run_in_box(boxes, record, "true", cwd=workspace, env={}, timeout_ms=TIMEOUT_MS,
                       config=sandbox)  # fmt: skip
            done = time.perf_counter()
            starts.append((started - began) * 1000)
            firsts.append((done - began) * 1000)
            boxes.end(run_id, time.monotonic() + 30)
        record, workspace, owner = _start(boxes, sandbox, root, f"bench-{runtime}-calls", image)
        typed: list[float] = []
        first_typed = 0.0
        if runtime == "runc":
            execs, typed, first_typed = exec_and_session_ms(
                boxes, record, workspace, owner, sandbox, calls
            )
        else:
            execs = [_exec_ms(boxes, record, workspace, sandbox) for _ in range(calls)]
        boxes.end(record.run_id, time.monotonic() + 30)
    return starts, firsts, execs, typed, first_typed


def _exec_ms(boxes: Boxes, record: BoxRecord, workspace: Path, sandbox: SandboxConfig) -> float:
    began = time.perf_counter()
    run_in_box(boxes, record, "true", cwd=workspace, env={}, timeout_ms=TIMEOUT_MS,
               config=sandbox)  # fmt: skip
    return (time.perf_counter() - began) * 1000


@contextlib.contextmanager
def _boxes(root: Path, runtime: str) -> Iterator[Boxes]:
    boxes = fresh_boxes(root, runtime, "cache")
    try:
        yield boxes
    finally:
        for record in boxes.records():
            boxes.end(record.run_id, time.monotonic() + 30)


def _start(
    boxes: Boxes, sandbox: SandboxConfig, root: Path, run_id: str, image: str
) -> tuple[BoxRecord, Path, tuple[int, int]]:
    workspace = prepare_workspace(root / "workspaces" / run_id, sandbox)
    assert workspace.owner is not None
    record = boxes.start(run_id, workspace.root, workspace.owner, image, time.monotonic() + 120)
    return record, workspace.root, workspace.owner


def _run_bash_ms(sandbox: SandboxConfig, workspaces: Path, calls: int) -> list[float]:
    workspace = prepare_workspace(workspaces / "bench-run-bash", sandbox)
    samples = []
    for _ in range(calls + 5):
        began = time.perf_counter()
        run_sandboxed(
            "true",
            cwd=workspace.root,
            home=workspace.root,
            env={},
            timeout_ms=TIMEOUT_MS,
            config=sandbox,
            identity=workspace.owner,
        )
        samples.append((time.perf_counter() - began) * 1000)
    return samples[5:]  # the first launches are made on the call's path
