"""A session's record, beside its holder's socket in the worker's own folder: which worker
process it lives for, its holder, and, once it ended, why. A call that finds a record but no
holder answering says "session lost" (or why it ended), never starts a new shell unasked."""

from __future__ import annotations

import os
import time
from pathlib import Path

from pydantic import BaseModel, ConfigDict, ValidationError


class SessionRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    #: The session's name, as calls give it.
    name: str
    #: The run's workspace: once it is gone, so is the run, and the record with it.
    workspace: str = ""
    #: The worker's main process, whose end ends the session.
    worker_pid: int
    holder_pid: int | None = None
    started: float
    #: Why the session ended, once it did of itself (idle, asked, its workspace gone).
    ended: str | None = None

    @classmethod
    def new(cls, name: str, worker_pid: int, workspace: str) -> SessionRecord:
        return cls(name=name, worker_pid=worker_pid, started=time.time(), workspace=workspace)

    @classmethod
    def read(cls, path: Path) -> SessionRecord | None:
        try:
            return cls.model_validate_json(path.read_bytes())
        except (OSError, ValidationError):
            return None

    def write(self, path: Path) -> None:
        """Written whole or not at all: a reader never sees half of it."""
        part = path.with_name(f".{path.name}.{os.getpid()}")
        try:
            part.write_text(self.model_dump_json())
            os.replace(part, path)
        finally:
            part.unlink(missing_ok=True)
