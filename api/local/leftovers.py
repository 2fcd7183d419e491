"""What a local stack killed with its process left behind, cleared by the next stack to start.

Each stack keeps a record of its owner and its children (``stack.json`` in the stack's folder,
``<tmp>/toolq-local-*``). The children's parent-death signal (``api.local.children``) ends them
with their owner already; the record is the second wall, for any that slipped past it. A stack
that starts ends the recorded children of every stack whose owner no longer runs, and removes
that stack's folder (its logs and Redis' files).
"""

from __future__ import annotations

import logging
import os
import shutil
import threading
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError

from api.local.processes import ProcessStamp, is_running, kill_all, stamp, this_machine

log = logging.getLogger(__name__)
#: How a stack's folder is named, in the temporary folder.
FOLDER_PREFIX = "toolq-local-"
RECORD = "stack.json"


class StackRecord(BaseModel):
    """A local stack's processes, as its folder records them."""

    model_config = ConfigDict(extra="forbid")

    #: Where the pids mean these processes (a temporary folder may be shared between machines).
    machine: str
    owner: ProcessStamp
    #: Redis and the workers' main processes (their pool processes are found below them).
    children: dict[str, ProcessStamp] = {}


class StackRecorder:
    """Keeps ``folder``'s record up to date as the stack's children start."""

    def __init__(self, folder: Path) -> None:
        owner = stamp(os.getpid())
        assert owner is not None, "this process runs"
        self._path = folder / RECORD
        self._record = StackRecord(machine=this_machine(), owner=owner)
        self._lock = threading.Lock()  # children start from the stack's supervisor thread too
        self._write()

    def started(self, name: str, pid: int) -> None:
        found = stamp(pid)
        if found is None:  # it ended already: nothing to clear later
            return
        with self._lock:
            self._record.children[name] = found
            self._write()

    def _write(self) -> None:
        # Whole or not at all: a stack killed mid-write leaves the record it had.
        partial = self._path.with_suffix(".partial")
        partial.write_text(self._record.model_dump_json())
        os.replace(partial, self._path)


def clear_leftovers(temporary: Path) -> list[int]:
    """End the children of the stacks under ``temporary`` whose owner no longer runs, and
    remove their folders; the pids ended."""
    ended: list[int] = []
    here = this_machine()
    for folder in temporary.glob(f"{FOLDER_PREFIX}*"):
        try:
            record = StackRecord.model_validate_json((folder / RECORD).read_bytes())
        except FileNotFoundError:
            continue  # a stack being made (its record comes first), or no stack's folder
        except (OSError, ValidationError) as exc:
            log.debug("not a local stack's record in %s: %s", folder, exc)
            continue
        if record.machine != here or is_running(record.owner):
            continue
        killed = kill_all(list(record.children.values()))
        if killed:
            log.warning(
                "ended %d process(es) of a local stack whose process was killed (%s)",
                len(killed),
                folder,
            )
        ended += killed
        shutil.rmtree(folder, ignore_errors=True)
    return ended
