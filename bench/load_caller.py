"""``python -m bench.load_caller toolq|bare``: one process that sends the scaling case's no-op
calls, so that the callers grow with the workers and never set the pace themselves.

It takes its settings from the ``TOOLQ_*`` variables, as a worker does. Each line it reads on
stdin is a number of calls: it sends them all at once (toolq: through one Dispatcher kept for
the process's life; bare Celery: ``apply_async`` each, then ``join_native``) and answers one
JSON line: the calls, when they started and ended (``time.monotonic``, the same clock in every
process of the machine), and the CPU time it spent. It exits at the end of its input.
"""

from __future__ import annotations

import asyncio
import json
import resource
import sys
import time
from typing import Any

from celery.result import ResultSet

from api.calls.dispatch import Dispatcher
from bench import bare_celery
from bench.round_trip import noop_burst, noop_spec
from worker.contract.settings import WorkerSettings, get_worker_settings

TOOLQ = "toolq"
BARE = "bare"
JOIN_TIMEOUT_S = 600


def _own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _answer(calls: int, started: float, cpu: float, failed: int) -> None:
    report: dict[str, Any] = {
        "calls": calls,
        "started": started,
        "ended": time.monotonic(),
        "cpu_s": _own_cpu() - cpu,
        "failed": failed,
    }
    print(json.dumps(report), flush=True)


async def serve_toolq(settings: WorkerSettings) -> None:
    spec = noop_spec(settings)
    async with Dispatcher(settings) as dispatcher:
        # The next order is awaited in a thread: the loop keeps reading replies meanwhile.
        while line := await asyncio.to_thread(sys.stdin.readline):
            calls = int(line)
            cpu, started = _own_cpu(), time.monotonic()
            failed = await noop_burst(dispatcher, spec, calls)
            _answer(calls, started, cpu, failed)


def serve_bare(settings: WorkerSettings) -> None:
    app = bare_celery.create_app(settings)
    task = app.tasks[bare_celery.NOOP_TASK]
    try:
        for line in sys.stdin:
            calls = int(line)
            cpu, started = _own_cpu(), time.monotonic()
            results = ResultSet([task.apply_async() for _ in range(calls)], app=app)
            results.join_native(timeout=JOIN_TIMEOUT_S)
            _answer(calls, started, cpu, 0)
    finally:
        app.close()


def main(argv: list[str]) -> int:
    if argv not in ([TOOLQ], [BARE]):
        print(f"usage: python -m bench.load_caller {TOOLQ}|{BARE}", file=sys.stderr)
        return 2
    settings = get_worker_settings()
    if argv == [TOOLQ]:
        asyncio.run(serve_toolq(settings))
    else:
        serve_bare(settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
