"""Where a run's work went: CPU seconds of each process, and Redis commands by name."""

from __future__ import annotations

import resource
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from bench.procinfo import cpu_seconds


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def redis_cpu_seconds(client: redis.Redis) -> float:
    info: dict[str, Any] = client.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def command_counts(client: redis.Redis) -> dict[str, int]:
    stats: dict[str, Any] = client.info("commandstats")
    return {name.removeprefix("cmdstat_"): int(v["calls"]) for name, v in stats.items()}


@dataclass
class CostMeter:
    """CPU of this process (the caller), of the worker processes and of Redis, and the Redis
    commands run, between ``start`` and ``stop``. The first of ``worker_pids`` is the worker's
    main process, Celery's consumer, whose share is told apart: it paces a prefork worker."""

    redis_url: str
    worker_pids: Callable[[], list[int]]

    def start(self) -> None:
        self._client = redis.Redis.from_url(self.redis_url)
        self._caller = _own_cpu()
        pids = self.worker_pids()
        self._workers = sum(cpu_seconds(pid) for pid in pids)
        self._consumer_pid = pids[0]
        self._consumer = cpu_seconds(pids[0])
        self._redis = redis_cpu_seconds(self._client)
        self._commands = command_counts(self._client)

    def stop(self, calls: int) -> dict[str, Any]:
        """Per call: CPU ms of caller, workers and Redis, and Redis commands by name."""
        caller = _own_cpu() - self._caller
        workers = sum(cpu_seconds(pid) for pid in self.worker_pids()) - self._workers
        consumer = cpu_seconds(self._consumer_pid) - self._consumer
        redis_cpu = redis_cpu_seconds(self._client) - self._redis
        after = command_counts(self._client)
        self._client.close()
        commands = {
            name: round((count - self._commands.get(name, 0)) / calls, 2)
            for name, count in sorted(after.items())
            if count - self._commands.get(name, 0) >= calls / 10
        }
        return {
            "cpu_ms_per_call": {
                "caller": round(caller * 1000 / calls, 3),
                "workers": round(workers * 1000 / calls, 3),
                "workers' consumer": round(consumer * 1000 / calls, 3),
                "redis": round(redis_cpu * 1000 / calls, 3),
            },
            "redis_commands_per_call": commands,
        }
