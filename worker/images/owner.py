"""Which worker holds a container, and the queue that reaches that worker alone.

A run's container belongs to the sandbox worker whose process started it: the worker's main
process (Celery's node), told apart from any later process of the same pid by the boot and the
process's start time. While it lives, every call of the run goes to its own queue,
``sandbox.<node>``; once it is gone, the next sweep on the host removes what it left.
"""

from __future__ import annotations

import os
import socket

from pydantic import BaseModel

from worker.contract.wire import Pool
from worker.plumbing.proc_stat import boot_id, start_time
from worker.sandbox.config import SandboxConfig
from worker.sandbox.host_registry import HostRegistry

#: A sandbox worker's own queue is this prefix and its node name.
PINNED_PREFIX = "sandbox."


class Owner(BaseModel):
    """A worker's main process, as the host knows it."""

    #: Celery's node name (``sandbox-1a2b3c@host``); the host name outside Celery.
    worker: str
    boot_id: str
    pid: int
    #: The process's start time (clock ticks after boot): a pid used again is another process.
    started: int
    #: The worker's lock in the host's registry (``worker.sandbox.host_registry``), and that
    #: registry's folder: they prove it alive or dead from any PID namespace, where its pid
    #: means nothing. Empty in records of workers that had none.
    lock: str = ""
    registry: str = ""
    #: The worker's fleet: a box of another fleet sharing this cache is never this one's to end.
    fleet: str = ""

    def alive(self) -> bool:
        if self.lock and self.registry:
            known = HostRegistry(self.registry).worker_alive(self.lock)
            if known is not None:
                return known
        return self.boot_id == boot_id() and start_time(self.pid) == self.started

    @property
    def queue(self) -> str:
        return pinned_queue(self.worker)


_worker: list[Owner] = []


def set_worker(node: str, config: SandboxConfig) -> None:
    """Called in the worker's main process, before its pool processes fork: they inherit it
    (and its lock in ``config``'s host registry, held while any of them lives)."""
    pid = os.getpid()
    registry, fleet = config.host_state, config.fleet()
    _worker[:] = [
        Owner(
            worker=node,
            boot_id=boot_id(),
            pid=pid,
            started=start_time(pid) or 0,
            lock=HostRegistry(registry).worker_id(fleet),
            registry=registry,
            fleet=fleet,
        )
    ]


def current_owner() -> Owner:
    """The worker this process serves (this process itself outside a Celery worker)."""
    if _worker:
        return _worker[0]
    pid = os.getpid()
    return Owner(
        worker=socket.gethostname(), boot_id=boot_id(), pid=pid, started=start_time(pid) or 0
    )


def pinned_queue(worker: str) -> str:
    """The queue of ``worker`` alone, which the calls of the runs it holds go to."""
    return f"{PINNED_PREFIX}{worker}"


def pool_of_queue(queue: str | None) -> str | None:
    """The pool a message came from: its queue's name, or ``sandbox`` for a worker's own."""
    if queue is not None and queue.startswith(PINNED_PREFIX):
        pool: Pool = "sandbox"
        return pool
    return queue
