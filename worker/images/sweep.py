"""Ending what nobody will end: boxes whose worker died, whose run's workspace was removed
(pruned, or the run ended without ending its box) or whose first process is gone; boxes a start
left half made; pulls a killed process left. Run by every sandbox worker when it starts and now
and then after (``worker.housekeeping``)."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from worker.contract.errors import ImageError
from worker.exceptions import RuntimeFailed
from worker.images.boxes import Boxes, BoxRecord, group_path
from worker.images.group import BoxGroup
from worker.images.mounts import remove_bundle
from worker.images.owner import current_owner
from worker.images.runtime import OciRuntime
from worker.plumbing.proc_stat import process_alive

log = logging.getLogger(__name__)


def sweep_boxes(boxes: Boxes) -> int:
    """End every box of this host that has no future; how many were ended."""
    ended = 0
    known: set[str] = set()
    for entry in list(boxes.folder.iterdir()) if boxes.folder.is_dir() else []:
        if not entry.is_dir():
            continue
        known.add(entry.name)
        record = boxes._read(entry)
        why = _why_end(record) if record is not None else "it never finished starting"
        if why is None:
            continue
        try:
            # Only a box nobody is using: a start or a call holds its lock.
            with boxes.turn(entry.name, time.monotonic(), record.image if record else ""):
                if record is None and boxes._read(entry) is not None:
                    continue  # it finished starting meanwhile
                _remove(boxes, entry, record)
        except ImageError:
            continue
        ended += 1
        log.info("ended container %s: %s", entry.name, why)
    ended += _forgotten(boxes, known)
    boxes.cache.remove_leftover_pulls()
    return ended


def _why_end(record: BoxRecord) -> str | None:
    own = current_owner().fleet
    if record.owner.fleet and own and record.owner.fleet != own:
        return None  # another fleet's, sharing this cache: its own workers end it
    if not record.owner.alive():
        return f"its worker {record.owner.worker} is gone"
    try:
        info = os.stat(record.workspace)
    except OSError:
        return "the run's workspace was removed"
    if (info.st_dev, info.st_ino) != tuple(record.workspace_id):
        return "the run's workspace was removed and made again"
    if not process_alive(record.init_pid):
        return "its first process is gone"
    return None


def _remove(boxes: Boxes, folder: Path, record: BoxRecord | None) -> None:
    names = [record.runtime] if record is not None else []
    names += [p.name for p in (boxes.settings.cache_root / "runtime").glob("*") if p.is_dir()]
    for name in dict.fromkeys(names):
        with contextlib.suppress(RuntimeFailed):
            OciRuntime.find(name, boxes.settings.cache_root).delete(folder.name)
    remove_bundle(folder)
    BoxGroup(boxes.settings.sandbox.cgroup_root, group_path(folder.name)).remove()


def _forgotten(boxes: Boxes, known: set[str]) -> int:
    """Containers in a runtime's state with no folder of theirs (a removal cut short)."""
    ended = 0
    runtimes = boxes.settings.cache_root / "runtime"
    for state in list(runtimes.iterdir()) if runtimes.is_dir() else []:
        try:
            runtime = OciRuntime.find(state.name, boxes.settings.cache_root)
        except RuntimeFailed:
            continue
        for name in runtime.names():
            if name.startswith("toolq-") and name not in known:
                with contextlib.suppress(RuntimeFailed):
                    runtime.delete(name)
                    ended += 1
    # Locks of boxes that are gone, each removed under itself (``Boxes.turn`` checks that the
    # lock it holds is still the one there).
    for lock in list(boxes.folder.glob("*.lock")) if boxes.folder.is_dir() else []:
        if lock.stem in known:
            continue
        with contextlib.suppress(ImageError), boxes.turn(lock.stem, time.monotonic(), ""):
            if not (boxes.folder / lock.stem).exists():
                lock.unlink(missing_ok=True)
    return ended
