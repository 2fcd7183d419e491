"""What a worker serves, published to Redis so callers can learn the fleet's tools."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import tempfile
import threading
import time
from collections.abc import Iterable
from typing import Any

import redis
from pydantic import BaseModel

from worker import keys
from worker.settings import Settings
from worker.tools.context import ToolContext
from worker.tools.interface import Pool
from worker.tools.workspace import Workspace

log = logging.getLogger(__name__)
HEARTBEAT_INTERVAL_S = 5.0
HEARTBEAT_TTL_S = 15


class ToolSpec(BaseModel):
    """One tool as the fleet serves it."""

    name: str
    description: str
    parameters: dict[str, Any]
    pool: Pool
    enabled_by_default: bool
    idempotent: bool
    default_timeout_ms: int
    timeout_argument: str | None = None
    #: Registration order on the worker, so every caller lists tools the same way.
    position: int = 0

    def schema_for_model(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }


def fleet_tool_specs(settings: Settings) -> list[ToolSpec]:
    """Every tool a worker with these settings has, in registration order."""
    from worker.executor import build_registry

    registry = build_registry(
        settings, ToolContext(), Workspace(tempfile.gettempdir()), passthrough=()
    )
    specs = []
    for position, name in enumerate(registry.get_tool_names()):
        tool = registry.get(name)
        assert tool is not None
        specs.append(
            ToolSpec(
                name=name,
                description=tool.description,
                parameters=tool.get_schema()["function"]["parameters"],
                pool=tool.pool,
                enabled_by_default=tool.enabled_by_default and name not in settings.disabled_tools,
                idempotent=tool.idempotent,
                default_timeout_ms=min(tool.default_timeout_ms, settings.max_timeout_ms),
                timeout_argument=tool.timeout_argument,
                position=position,
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


def read_manifest(client: redis.Redis) -> dict[str, ToolSpec]:
    raw: dict[bytes, bytes] = client.hgetall(keys.MANIFEST)  # type: ignore[assignment]
    specs = [ToolSpec.model_validate_json(v) for v in raw.values()]
    return {s.name: s for s in sorted(specs, key=lambda s: (s.position, s.name))}


def live_workers(client: redis.Redis, pool: str) -> list[dict[str, Any]]:
    names = list(client.scan_iter(match=keys.worker_heartbeats(pool), count=500))
    if not names:
        return []
    values = client.mget(names)
    return [json.loads(v) for v in values if v]


class Heartbeat:
    """Keeps ``toolq:worker:<pool>:<name>`` and the manifest alive while the worker runs."""

    def __init__(
        self, client: redis.Redis, worker: str, pools: Iterable[str], specs: list[ToolSpec]
    ) -> None:
        self._redis = client
        self._specs = specs
        self._worker = worker
        self._pools = sorted(set(pools))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="toolq-heartbeat", daemon=True)
        self._info = json.dumps(
            {
                "worker": worker,
                "pools": self._pools,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "started": time.time(),
            }
        )

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self) -> None:
        # The manifest goes out with every beat: a Redis that restarted empty gets it back.
        publish_manifest(self._redis, self._specs, self._pools)
        pipe = self._redis.pipeline(transaction=False)
        for pool in self._pools:
            pipe.set(keys.worker_heartbeat(pool, self._worker), self._info, ex=HEARTBEAT_TTL_S)
        pipe.execute()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(redis.RedisError):  # it expires by itself
            self._redis.delete(*(keys.worker_heartbeat(p, self._worker) for p in self._pools))

    def _run(self) -> None:
        while not self._stop.wait(HEARTBEAT_INTERVAL_S):
            try:
                self.beat()
            except redis.RedisError as exc:
                log.warning("heartbeat failed: %s", exc)
