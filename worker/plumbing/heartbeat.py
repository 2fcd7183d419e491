"""A live worker's presence in Redis: its heartbeat and the tools it serves, read by callers."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

import redis

from worker.contract.keys import keys
from worker.contract.wire import Served, ToolSpec, WorkerInfo, WorkerLimits

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TTL_S = 15
#: How long ``stop()`` waits for a beat on its way (a Redis that stopped answering holds it).
STOP_WAIT_S = 2.0


class Heartbeat:
    """Keeps ``toolq:worker:<pool>:<name>`` and the manifest alive while the worker runs.

    Agents workers beat too (pool ``agents``, no tools), so callers see them live the same way.
    A beat goes out only while ``serving()`` says the worker takes calls: a process that lives
    on without its consumer drops out of the fleet when its key lapses.
    """

    def __init__(
        self,
        client: redis.Redis,
        worker: str,
        pools: Iterable[Served],
        specs: list[ToolSpec],
        unavailable: dict[str, str] | None = None,
        limits: WorkerLimits | None = None,
        serving: Callable[[], bool] | None = None,
    ) -> None:
        self._redis = client
        self._serving = serving
        self._specs = specs
        self._worker = worker
        self._pools: list[Served] = sorted(set(pools))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolq-heartbeat", daemon=True)
        self._info = WorkerInfo(
            worker=worker,
            pools=self._pools,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=time.time(),
            unavailable=unavailable or {},
            limits=limits,
        )

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        info = self._info.model_copy(update={"beat_at": time.time()}).model_dump_json()
        pipe = self._redis.pipeline(transaction=False)
        # The manifest goes out with every beat: a Redis that restarted empty gets it back.
        for spec in self._specs:
            if spec.pool in self._pools:
                pipe.hset(keys.MANIFEST, spec.name, spec.model_dump_json())
        for pool in self._pools:
            pipe.set(keys.worker_heartbeat(pool, self._worker), info, ex=HEARTBEAT_TTL_S)
        pipe.execute()

    def stop(self) -> None:
        """Ends the beats and withdraws the worker's keys.

        It waits for a beat on its way: its thread must not write after the keys are gone, nor
        use the client after its owner closes it once ``stop()`` returns.
        """
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(STOP_WAIT_S)
        self._withdraw()

    def _withdraw(self) -> None:
        with contextlib.suppress(redis.RedisError):  # it expires by itself
            self._redis.delete(*(keys.worker_heartbeat(p, self._worker) for p in self._pools))

    def _run(self) -> None:
        skipping = False
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            if self._serving is not None and not self._serving():
                if not skipping:
                    log.warning("the worker takes no calls now (its consumer is not running)")
                skipping = True
                continue
            skipping = False
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
            if self._stop.is_set():
                # Stopped while this beat was on its way and stop() gave up waiting for it: the
                # beat must not outlive the stop.
                self._withdraw()
