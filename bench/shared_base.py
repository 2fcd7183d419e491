"""Case 12's shared-base pair: the cold start of an image on a fresh cache (every layer pulled and
unpacked, the container started), beside the cold start of an image that adds 1 KB to it once
the base is cached (only its new layer unpacked), with what each wrote into the cache's layers.

The base is the busybox image of the tests with every applet and 32 MiB of incompressible files
(a stand-in for a system's packages); each pair starts on an empty cache of its own.
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from bench.stats import CaseResult, Comparison, summarize
from tests.worker.images.builders import all_applets, build_image, derive_image
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.images.boxes import Boxes, BoxSettings
from worker.images.fetch import Tools
from worker.images.layer_store import disk_usage
from worker.sandbox import SandboxConfig
from worker.tools.factory import prepare_workspace

#: What the base holds besides busybox: incompressible, so that unpacking it costs as a real one.
BASE_PAYLOAD_BYTES = 32 << 20
#: What the second image adds.
ADDED = b"x" * 1024


def shared_base_pair(
    result: CaseResult, root: Path, runtime: str, pairs: int, sandbox: SandboxConfig
) -> None:
    """``pairs`` cold starts of the base and of the image on it, into ``result``; the runs'
    workspaces below ``root / "workspaces"``, as ``sandbox`` makes them."""
    layout = root / "shared-layout"
    payload = {f"/opt/base/{n}.bin": os.urandom(BASE_PAYLOAD_BYTES // 8) for n in range(8)}
    base = build_image(layout, "base", name="toolq-base", applets=all_applets(), files=payload)
    derived = derive_image(layout, "base", "derived", {"/etc/derived": ADDED})
    firsts: list[float] = []
    seconds: list[float] = []
    first_bytes: list[int] = []
    second_bytes: list[int] = []
    order = ((base, firsts, first_bytes), (derived, seconds, second_bytes))
    for n in range(pairs):
        boxes = fresh_boxes(root, runtime, "cache-shared")
        layers = boxes.settings.cache_root / "layers"
        for image, times, written in order:
            before = disk_usage(layers) if layers.exists() else 0
            run_id = f"bench-shared-{runtime}-{n}-{len(times)}-{image.rsplit(':', 1)[1]}"
            workspace = prepare_workspace(root / "workspaces" / run_id, sandbox)
            assert workspace.owner is not None
            began = time.perf_counter()
            boxes.start(run_id, workspace.root, workspace.owner, image, time.monotonic() + 120)
            times.append((time.perf_counter() - began) * 1000)
            written.append(disk_usage(layers) - before)
            boxes.end(run_id, time.monotonic() + 30)
    first, second = summarize(firsts), summarize(seconds)
    result.figures[f"{runtime}_shared_base"] = {
        "base_cold_start": first,
        "on_cached_base_cold_start": second,
        "base_layers_written_bytes": max(first_bytes),
        "on_cached_base_layers_written_bytes": max(second_bytes),
    }
    result.samples_ms[f"{runtime}: cold start of the base"] = firsts
    result.samples_ms[f"{runtime}: cold start of an image adding 1 KB to it"] = seconds
    result.comparisons.append(
        Comparison(
            metric=f"{runtime}: cold start of an image adding 1 KB to a cached base (p50)",
            value=second["p50_ms"],
            baseline=first["p50_ms"],
            baseline_name="the base's own cold start",
            unit="ms",
        )
    )
    result.notes.append(
        f"Shared base ({runtime}): the base wrote {max(first_bytes):,} bytes of layers, the image "
        f"on it {max(second_bytes):,}; each pair on an empty cache."
    )


def fresh_boxes(root: Path, runtime: str, prefix: str) -> Boxes:
    """A sandbox worker's boxes on an empty cache of their own below ``root``."""
    cache = Path(tempfile.mkdtemp(prefix=f"{prefix}-{runtime}-", dir=root))
    os.chmod(cache, 0o711)
    return Boxes(
        BoxSettings(
            cache_root=cache,
            cache_bytes=1 << 30,
            runtime=runtime,
            tools=Tools(),
            sandbox=SandboxSettings(
                uid_range="", memory_mb=1024, max_processes=256, file_size_mb=256
            ),
            id_block=UidRange.parse(DEFAULT_UID_RANGE).last + 1,
        )
    )
