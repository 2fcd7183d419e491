"""A tool plugin that adds no tool: it times, in each worker process that loads it, the steps of a
run (its start: the workspace, the uid claim, the folders; each call; its end) by the CPU each
one took, and writes the sums to a file of the process's own.

Loaded (``TOOLQ_PLUGINS``) only where ``BENCH_STEP_PROBES_DIR`` names a folder: the bench's
real-items case (``bench.real_items``) reads ``<folder>/<pid>.json`` before and after each round.
A sum is written at most every ``WRITE_EVERY_S`` by a thread of the process, never on a call's
path.
"""

from __future__ import annotations

import json
import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.probes import CpuProbe
from worker.tools.context import ToolContext
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

FOLDER_ENV = "BENCH_STEP_PROBES_DIR"
WRITE_EVERY_S = 0.1
#: The steps, by the function that does each: (module or class, attribute, label). Nested ones
#: are told apart by the reader (``StepTotals``).
CALL = "call: Executor.handle (start marker, tool, sealed answer)"
RUNNER = "call: CallRunner.run (the tool in its workspace)"
START = "run start: workspace made ready (uid claim, folders)"
UID_CLAIM = "run start: uid claim"
END = "run end: workspace removed (remove_held)"
UID_RELEASE = "run end: uid let go (release)"
UID_RESET = "run end: uid reset (reset_uid)"
PROBED = (
    ("worker.executor", "Executor", "handle", CALL),
    ("worker.call_runner", "CallRunner", "run", RUNNER),
    ("worker.call_runner", None, "prepare_workspace", START),
    ("worker.sandbox.config", None, "identity_of", UID_CLAIM),
    ("worker.tools.service", None, "remove_held", END),
    ("worker.retention", None, "release", UID_RELEASE),
    ("worker.sandbox.identity", None, "reset_uid", UID_RESET),
)


@dataclass
class _Installed:
    pid: int
    probes: list[CpuProbe]


_installed: _Installed | None = None
_lock = threading.Lock()


def register(registry: ToolRegistry, context: ToolContext, workspace: Workspace) -> None:
    """The plugin hook: probes installed once per process (a pool process inherits its parent's
    and starts its own counts and writer)."""
    folder = os.environ.get(FOLDER_ENV)
    if not folder:
        return
    global _installed
    with _lock:
        if _installed is not None and _installed.pid == os.getpid():
            return
        if _installed is None:
            probes = [_probe(*where) for where in PROBED]
            for probe in probes:
                probe.install()
        else:  # forked: the parent's probes, counted afresh here
            probes = _installed.probes
            for probe in probes:
                probe.seconds, probe.calls = 0.0, 0
        _installed = _Installed(os.getpid(), probes)
    threading.Thread(
        target=_write_forever, args=(Path(folder), _installed), name="bench-probes", daemon=True
    ).start()


def _probe(module: str, owner: str | None, attribute: str, label: str) -> CpuProbe:
    imported = __import__(module, fromlist=["_"])
    return CpuProbe(getattr(imported, owner) if owner else imported, attribute, label)


def _write_forever(folder: Path, installed: _Installed) -> None:
    last: dict[str, Any] = {}
    path = folder / f"{installed.pid}.json"
    while os.getpid() == installed.pid:
        sums = {p.label: [p.seconds, p.calls] for p in installed.probes}
        if sums != last:
            scratch = path.with_suffix(".tmp")
            scratch.write_text(json.dumps(sums))
            scratch.replace(path)
            last = sums
        time.sleep(WRITE_EVERY_S)


def read_sums(folder: Path) -> dict[int, dict[str, tuple[float, int]]]:
    """Every probed process's sums so far: CPU seconds and calls by step, by pid."""
    sums: dict[int, dict[str, tuple[float, int]]] = {}
    for path in folder.glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        sums[int(path.stem)] = {label: (float(s), int(n)) for label, (s, n) in data.items()}
    return sums


def difference(
    after: dict[int, dict[str, tuple[float, int]]], before: dict[int, dict[str, tuple[float, int]]]
) -> dict[str, tuple[float, int]]:
    """What every process spent by step between two reads, summed over the processes."""
    total: dict[str, tuple[float, int]] = {}
    for pid, steps in after.items():
        for label, (seconds, calls) in steps.items():
            s0, n0 = before.get(pid, {}).get(label, (0.0, 0))
            s, n = total.get(label, (0.0, 0))
            total[label] = (s + seconds - s0, n + calls - n0)
    return total
