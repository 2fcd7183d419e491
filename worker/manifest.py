"""What a worker serves, published to Redis so callers can learn the fleet's tools."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Iterable

import redis

from worker.protocol import POOLS, Pool, Served, ToolSpec, WorkerInfo, WorkerLimits, keys
from worker.settings import WorkerSettings

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TTL_S = 15


def fleet_tool_specs(settings: WorkerSettings, pools: Iterable[Pool] = POOLS) -> list[ToolSpec]:
    """Every tool a worker of ``pools`` with these settings has, in registration order."""
    from worker.executor import build_registry

    registry = build_registry(settings, pools=pools)
    specs = []
    for position, name in enumerate(registry.get_tool_names()):
        tool = registry.get(name)
        assert tool is not None
        own = tool.default_timeout_ms
        default_timeout_ms = settings.default_timeout_ms if own is None else own
        specs.append(
            ToolSpec(
                name=name,
                description=tool.description,
                parameters=tool.get_schema()["function"]["parameters"],
                pool=tool.pool,
                enabled_by_default=tool.enabled_by_default and name not in settings.disabled_tools,
                idempotent=tool.idempotent,
                default_timeout_ms=min(default_timeout_ms, settings.max_timeout_ms),
                timeout_argument=tool.timeout_argument,
                position=position,
                for_model=tool.for_model,
            )
        )
    return specs


def publish_manifest(client: redis.Redis, specs: Iterable[ToolSpec], pools: Iterable[str]) -> None:
    served = set(pools)
    pipe = client.pipeline(transaction=False)
    for spec in specs:
        if spec.pool in served:
            pipe.hset(keys.MANIFEST, spec.name, spec.model_dump_json())
    pipe.execute()


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
        # The manifest goes out with every beat: a Redis that restarted empty gets it back.
        publish_manifest(self._redis, self._specs, self._pools)
        info = self._info.model_copy(update={"beat_at": time.time()}).model_dump_json()
        pipe = self._redis.pipeline(transaction=False)
        for pool in self._pools:
            pipe.set(keys.worker_heartbeat(pool, self._worker), info, ex=HEARTBEAT_TTL_S)
        pipe.execute()

    def stop(self) -> None:
        self._stop.set()
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
                # Stopped while this beat was on its way: it must not outlive the stop.
                self.stop()
