"""A sandbox worker's node name is its own: the name of its queue (``sandbox.<node>``) and of
its heartbeat, which a pinned run's calls are sent by. Two workers under one name would share
that queue, and a run's calls would reach the worker that does not hold its container.

The name is claimed as the worker starts, atomically, until the heartbeat it then keeps alive
announces it; a name another live worker announces or has just claimed is refused in one line.
What a worker of this host whose process is gone left (the same worker started again by its
supervisor) is taken over.
"""

from __future__ import annotations

import os
import socket
import time

import redis
from pydantic import ValidationError

from worker.contract.keys import keys
from worker.contract.wire import WorkerInfo
from worker.exceptions import NodeNameTaken
from worker.plumbing.heartbeat import HEARTBEAT_TTL_S
from worker.plumbing.proc_stat import process_alive


def claim_node_name(client: redis.Redis, node: str) -> None:
    """Claim ``node`` for this process until its heartbeat announces it, or raise
    ``NodeNameTaken`` naming who holds the name: a worker that announces itself under it, or
    one that claimed it as it started and has not announced itself yet."""
    claim = keys.node_claim(node)
    mine = WorkerInfo(
        worker=node,
        pools=["sandbox"],
        host=socket.gethostname(),
        pid=os.getpid(),
        started=time.time(),
    ).model_dump_json()
    claimed = client.set(claim, mine, nx=True, ex=HEARTBEAT_TTL_S)
    holders = [client.get(keys.worker_heartbeat("sandbox", node))]
    if not claimed:
        holders.append(client.get(claim))
    for raw in holders:
        holder = _holder(raw)
        if holder is not None and not _left_by_a_dead_worker_here(holder):
            if claimed:
                client.delete(claim)
            raise NodeNameTaken(
                f"another sandbox worker already runs as node {node!r} (pid {holder.pid} on "
                f"host {holder.host}); give each worker a name of its own (celery -n NAME, or "
                "start it with toolq worker, which names each one uniquely)"
            )
    if not claimed:
        client.set(claim, mine, ex=HEARTBEAT_TTL_S)


def _holder(raw: bytes | str | None) -> WorkerInfo | None:
    if raw is None:
        return None
    try:
        return WorkerInfo.model_validate_json(raw)
    except ValidationError:
        return None  # not a WorkerInfo at all: nobody holds the name


def _left_by_a_dead_worker_here(holder: WorkerInfo) -> bool:
    """The name was announced by this very process (a container whose worker has the same pid
    each time it starts) or by a process of this host that is gone."""
    if holder.host != socket.gethostname():
        return False
    return holder.pid == os.getpid() or not process_alive(holder.pid)
