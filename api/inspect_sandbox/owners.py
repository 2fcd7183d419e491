"""Which eval owns a sample's workspace, and whether that eval still runs.

Every process that opens the toolq sandbox is an owner with an id of its own, which the run id
of each of its samples' workspaces carries: ``inspect-<task>-<owner>-<sample>``. While the
sandbox is open the owner says it runs in two places:

- a lease in the fleet's Redis (``toolq:inspect:eval:<owner>``, renewed every 20 s, gone 60 s
  after the last renewal), for a cleanup on any machine;
- a file on this machine (``<tmp>/toolq-inspect-evals/<owner>.json``), for a cleanup that starts
  a local stack of its own, whose Redis is not the eval's.

Both name the owner's process (machine, pid, start), so an eval killed outright is known to have
ended at once on its own machine, and elsewhere once its lease runs out.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import tempfile
import threading
import uuid
from pathlib import Path

import redis
from pydantic import BaseModel, ConfigDict, ValidationError

from api.local.processes import ProcessStamp, is_running, stamp, this_machine
from worker.contract.keys import INSPECT_EVAL_PREFIX, inspect_eval_key

log = logging.getLogger(__name__)
#: Every toolq sandbox's run id starts so.
RUN_PREFIX = "inspect-"
LEASE_S = 60
RENEW_S = 20
_RUN = re.compile(rf"{RUN_PREFIX}.*-([0-9a-f]{{8}})-[0-9a-f]{{8}}")


class OwnerRecord(BaseModel):
    """An eval's process, as its lease and its file hold it."""

    model_config = ConfigDict(extra="forbid")

    owner: str
    machine: str
    process: ProcessStamp


def new_run_id(task_name: str, owner: str) -> str:
    """A fresh run id for a sample of ``owner``'s, naming the task, for its workspace folder."""
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", task_name).strip("-._")[:60] or "task"
    return f"{RUN_PREFIX}{slug}-{owner}-{uuid.uuid4().hex[:8]}"


def owner_of(run_id: str) -> str | None:
    """The owner a toolq sandbox's run id names; None for any other run id."""
    found = _RUN.fullmatch(run_id)
    return found[1] if found else None


def owners_folder() -> Path:
    return Path(tempfile.gettempdir()) / "toolq-inspect-evals"


class EvalOwner:
    """This process as the owner of its samples' workspaces, from ``start`` to ``stop``."""

    def __init__(self, redis_url: str) -> None:
        self.id = uuid.uuid4().hex[:8]
        process = stamp(os.getpid())
        assert process is not None, "this process runs"
        self._record = OwnerRecord(owner=self.id, machine=this_machine(), process=process)
        self._client = redis.Redis.from_url(redis_url)
        self._file = owners_folder() / f"{self.id}.json"
        self._stop = threading.Event()
        self._renewer = threading.Thread(target=self._renew, name="toolq-eval-lease", daemon=True)

    def start(self) -> None:
        folder = self._file.parent
        with contextlib.suppress(FileExistsError):
            folder.mkdir()
            folder.chmod(0o1777)  # every user's evals, as in /tmp: each removes its own file
        try:
            self._file.write_text(self._record.model_dump_json())
        except OSError as exc:
            log.warning(
                "a cleanup with a local stack of its own cannot tell this eval runs (%s): "
                "its samples' workspaces are still removed as they end",
                exc,
            )
        self._lease()
        self._renewer.start()

    def stop(self) -> None:
        self._stop.set()
        if self._renewer.is_alive():
            self._renewer.join()
        with contextlib.suppress(redis.RedisError):
            self._client.delete(inspect_eval_key(self.id))
        self._client.close()
        self._file.unlink(missing_ok=True)

    def _lease(self) -> None:
        self._client.set(inspect_eval_key(self.id), self._record.model_dump_json(), ex=LEASE_S)

    def _renew(self) -> None:
        while not self._stop.wait(RENEW_S):
            # A Redis that blinks costs one renewal; the lease outlasts two more.
            with contextlib.suppress(redis.RedisError):
                self._lease()


def live_owners(redis_url: str) -> set[str]:
    """The owners whose evals run now, as far as can be told from here: those of this machine
    whose process runs, and those of other machines whose lease has not run out. The files of
    owners of this machine that ended are removed on the way."""
    here = this_machine()
    records: list[OwnerRecord] = []
    client = redis.Redis.from_url(redis_url)
    try:
        for key in client.scan_iter(f"{INSPECT_EVAL_PREFIX}*"):
            records += _parsed(client.get(key))
    finally:
        client.close()
    for path in owners_folder().glob("*.json"):
        with contextlib.suppress(OSError):
            found = _parsed(path.read_bytes())
            if not found or (found[0].machine == here and not is_running(found[0].process)):
                path.unlink(missing_ok=True)
            records += found
    return {
        record.owner for record in records if record.machine != here or is_running(record.process)
    }


def _parsed(data: bytes | str | None) -> list[OwnerRecord]:
    if data is None:  # its lease ran out between the scan and the read
        return []
    try:
        return [OwnerRecord.model_validate_json(data)]
    except ValidationError:
        return []
