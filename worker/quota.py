"""The workspace quota: how much one run's workspace may hold (``TOOLQ_WORKSPACE_QUOTA_BYTES``).

The quota holds by accounting. After each call of a tool that can add to the workspace (write
tools, run_bash) or free space (remove), the worker measures the workspace, within a time bound.
Past the quota the call's answer says so and the run is marked: tools that add refuse to start
until a later measurement finds the run under its quota again (``WAY_OUT``). The mark is
a file beside the workspaces, so every worker sharing the volume honours it. A single call can
still write past the quota before it is measured; ``TOOLQ_SANDBOX_FILE_SIZE_MB`` bounds each
file it writes.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from worker.state_folder import STATE_DIR

#: The longest a measurement may take; a workspace too large to walk in time counts what was
#: seen (enough to find it past its quota, never enough to lift the mark).
MEASURE_BOUND_S = 1.0
_BLOCK = 512


@dataclass(frozen=True, slots=True)
class Measurement:
    """Bytes a workspace holds on disk; ``complete`` is False when the walk ran out of time."""

    used_bytes: int
    complete: bool


def measure(root: Path, bound_s: float = MEASURE_BOUND_S) -> Measurement:
    """Disk space under ``root``, symbolic links not followed, each hard-linked file once."""
    deadline = time.monotonic() + bound_s
    used = 0
    seen: set[tuple[int, int]] = set()
    pending = [str(root)]
    while pending:
        if time.monotonic() > deadline:
            return Measurement(used, False)
        directory = pending.pop()
        with contextlib.suppress(OSError), os.scandir(directory) as listing:
            for entry in listing:
                with contextlib.suppress(OSError):
                    info = entry.stat(follow_symlinks=False)
                    if info.st_nlink > 1 and not stat.S_ISDIR(info.st_mode):
                        if (info.st_dev, info.st_ino) in seen:
                            continue
                        seen.add((info.st_dev, info.st_ino))
                    used += info.st_blocks * _BLOCK
                    if stat.S_ISDIR(info.st_mode):
                        pending.append(entry.path)
    return Measurement(used, True)


#: What a model can do past the quota with the tools on by default: write_file runs when it can
#: only shrink a file (``ExecutableTool.only_shrinks``); remove is off unless the run enables it.
WAY_OUT = (
    "make files smaller with write_file (the same path with shorter content; empty content "
    "empties a file), or delete them with remove where that tool is on"
)


class WorkspaceQuota:
    """The quota of the run workspaces under one root; ``quota_bytes`` 0 means none."""

    def __init__(self, root: Path, quota_bytes: int, bound_s: float = MEASURE_BOUND_S) -> None:
        self.root = Path(root)
        self.quota_bytes = quota_bytes
        self._bound_s = bound_s
        self._marks = self.root / STATE_DIR / "over-quota"

    @property
    def enforced(self) -> bool:
        return self.quota_bytes > 0

    def refusal(self, run_id: str) -> str | None:
        """Why a tool that adds to ``run_id``'s workspace may not start, or None."""
        if not self.enforced:
            return None
        try:
            used = int((self._marks / run_id).read_text() or 0)
        except (OSError, ValueError):
            return None
        return (
            f"the run's workspace holds {size_text(used)}, past its quota of "
            f"{size_text(self.quota_bytes)}: tools that write (and run_bash) refuse to start until "
            f"it is under the quota again; {WAY_OUT}"
        )

    def account(self, run_id: str, workspace: Path) -> str | None:
        """Measure ``run_id``'s workspace after a call; a notice for the answer when it is past
        its quota (the run is then marked), None otherwise (any mark is lifted)."""
        if not self.enforced:
            return None
        found = measure(workspace, self._bound_s)
        mark = self._marks / run_id
        if found.used_bytes > self.quota_bytes:
            self._marks.mkdir(parents=True, exist_ok=True)
            mark.write_text(str(found.used_bytes))
            at_least = "" if found.complete else "at least "
            return (
                f"the workspace now holds {at_least}{size_text(found.used_bytes)}, past its "
                f"quota of {size_text(self.quota_bytes)}: tools that write (and run_bash) will "
                f"refuse to start until it is under the quota again; {WAY_OUT}"
            )
        if found.complete:
            with contextlib.suppress(FileNotFoundError):
                mark.unlink()
        return None

    def forget(self, run_id: str) -> None:
        """The run's workspace is gone: so is its mark."""
        with contextlib.suppress(FileNotFoundError):
            (self._marks / run_id).unlink()


def size_text(count: int) -> str:
    """``1.0 GiB (1,073,741,824 bytes)``."""
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= scale:
            return f"{count / scale:.1f} {unit} ({count:,} bytes)"
    return f"{count:,} bytes"
