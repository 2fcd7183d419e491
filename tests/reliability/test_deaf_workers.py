"""A worker serves or exits, never alive and deaf: through Redis restarts, a result store that
refuses writes, and an unrecoverable error in its consumer.

Each worker here is a real ``celery worker`` process on a Redis of the test's own, started
alone: nothing starts it again, so an exit is seen as one.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.calls.fleet import live_workers
from api.local.stack import worker_argv, worker_environment
from tests.conftest import Caller, RedisServer, fleet_settings, start_logged, wait_for
from tests.plugins.faulty_consumer import STOP_HANGS_VARIABLE
from tests.reliability.report import Counts, Report
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallResult
from worker.plumbing.heartbeat import HEARTBEAT_TTL_S
from worker.plumbing.lifeline import FAILED_STOP_S

pytestmark = pytest.mark.integration

#: Rounds of two restarts: one mid-traffic, one as the worker connects again.
RESTART_ROUNDS = 8
#: How long Redis stays down in the first restart of a round: the worker's reads, writes and
#: acknowledgements fail meanwhile.
OUTAGE_S = 0.5
#: Answers a worker must give after a restart to count as serving.
SERVED_AFTER_RESTART = 5
#: How long the store refuses writes: the fault itself.
REFUSAL_S = 3.0
#: Bounds on waits for what must happen: generous, for a busy machine.
READY_S = 60.0
SERVE_S = 90.0
EXIT_S = FAILED_STOP_S + 90.0


class LoneWorker:
    """One ``celery -A <app> worker -Q <pool>`` process, logging to a file, that nothing
    restarts."""

    def __init__(
        self,
        settings: WorkerSettings,
        pool: str,
        log_dir: Path,
        *,
        app: str = "worker.app",
        env: dict[str, str] | None = None,
    ) -> None:
        self.settings = settings
        self.pool = pool
        node = f"{pool}-{uuid.uuid4().hex[:6]}"
        argv = worker_argv(
            pool,
            node=f"{node}@%h",
            concurrency=2,
            loglevel="INFO",
            extra=("--without-gossip", "--without-mingle"),
        )
        argv[argv.index("-A") + 1] = app
        self.log_path = log_dir / f"{node}.log"
        env = {**os.environ, **worker_environment(settings), **(env or {})}
        self.process = start_logged(argv, env, self.log_path)

    @property
    def pid(self) -> int:
        return self.process.pid

    def exit_code(self) -> int | None:
        return self.process.poll()

    def live(self) -> bool:
        """What `toolq status` says: a heartbeat of this process has not expired."""
        client = redis.Redis.from_url(self.settings.redis_url)
        try:
            return any(w.pid == self.pid for w in live_workers(client, self.pool))
        except redis.RedisError:
            return False
        finally:
            client.close()

    def wait_ready(self) -> LoneWorker:
        def ready() -> bool:
            if self.exit_code() is not None:
                raise AssertionError(f"the {self.pool} worker exited:\n{self.log()[-3000:]}")
            return self.live()

        wait_for(ready, READY_S, f"the {self.pool} worker to announce itself")
        return self

    def wait_exit(self) -> int:
        return self.process.wait(timeout=EXIT_S)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        if self.exit_code() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                os.killpg(self.pid, signal.SIGKILL)
                self.process.wait(timeout=30)


@pytest.fixture
def lone_worker(tmp_path: Path) -> Iterator[Callable[..., LoneWorker]]:
    """Start lone workers (``lone_worker(settings, pool)``, with LoneWorker's options), logging
    to the test's folder: each is stopped after the test."""
    started: list[LoneWorker] = []

    def start(settings: WorkerSettings, pool: str, **options: Any) -> LoneWorker:
        worker = LoneWorker(settings, pool, tmp_path, **options)
        started.append(worker)
        return worker

    yield start
    for worker in started:
        worker.stop()


def settings_for(server: RedisServer, tmp_path: Path, **overrides: object) -> WorkerSettings:
    root = tmp_path / "workspaces"
    root.mkdir()
    root.chmod(0o755)
    return fleet_settings(server.url, root, **overrides)


@pytest.fixture
def settings(own_redis: RedisServer, tmp_path: Path) -> WorkerSettings:
    """The settings of workers on the test's own Redis, with workspaces in its folder."""
    return settings_for(own_redis, tmp_path)


def served(results: list[ToolCallResult]) -> int:
    """Answers a worker gave (the caller's own, no_answer and broker_unavailable, name none)."""
    return sum(r.worker is not None for r in results)


# --- Redis restarted under traffic -------------------------------------------------------------


@pytest.mark.timeout(900)
async def test_through_redis_restarts_a_worker_serves_or_exits(
    own_redis: RedisServer,
    lone_worker: Callable[..., LoneWorker],
    tmp_path: Path,
    report: Report,
) -> None:
    settings = settings_for(
        own_redis,
        tmp_path,
        default_timeout_ms=1_500,
        max_timeout_ms=3_000,
        hard_limit_grace_s=0.5,
        reply_margin_s=0.5,
    )
    worker = lone_worker(settings, "tools").wait_ready()
    with report.case(
        "Faults",
        f"Redis restarted {2 * RESTART_ROUNDS} times under traffic to a tools worker (quick "
        "calls, slow ones, one past its hard limit), every second restart as the worker "
        "connects again",
        "after each restart the worker answers calls again, or exits non-zero with its "
        "heartbeat gone; never alive and deaf",
    ) as row:
        results: list[ToolCallResult] = []
        stop = asyncio.Event()
        rounds_served = 0
        async with Dispatcher(settings) as dispatcher:
            caller = Caller(dispatcher, settings, "run-restarts")

            async def traffic() -> None:
                while not stop.is_set():
                    results.extend(
                        await asyncio.gather(
                            *(caller("noop", {}) for _ in range(6)),
                            caller("slow_read", {"seconds": 1.0, "marker": "slow"}),
                            caller("stubborn", {}, timeout_ms=300),
                        )
                    )

            sending = asyncio.ensure_future(traffic())
            slow_runs = Path(settings.workspace_root) / caller.run_id / "slow.runs"
            try:
                for _ in range(RESTART_ROUNDS):
                    await asyncio.to_thread(_restart_twice, own_redis, worker, slow_runs)
                    before = served(results)

                    def serves_or_exited(before: int = before) -> bool:
                        if worker.exit_code() is not None:
                            return True
                        return served(results) >= before + SERVED_AFTER_RESTART

                    await asyncio.to_thread(
                        wait_for, serves_or_exited, SERVE_S, "answers after the restart, or an exit"
                    )
                    if worker.exit_code() is not None:
                        break
                    rounds_served += 1
            finally:
                stop.set()
                await sending
            code = worker.exit_code()
            last = None if code is not None else await caller("noop", {})
        log = worker.log()
        kinds = collections.Counter(r.error_kind or "ok" for r in results)
        skipped = log.count("the broker connection is already closed")
        fatal = log.count("Unrecoverable error")
        if code is None:
            assert last is not None
            ending = f"still running, answered '{last.output}' at the end"
        else:
            await asyncio.to_thread(
                wait_for, lambda: not worker.live(), HEARTBEAT_TTL_S * 4, "its heartbeat to go"
            )
            ending = f"exited with {code}, heartbeat gone"
        row.observed = (
            f"answered again after {rounds_served} of {RESTART_ROUNDS} rounds; {ending}; "
            f"{fatal} unrecoverable errors; {skipped} acknowledgements or restores through a "
            "connection already closed skipped (kombu's `'NoneType' object has no attribute "
            "'hostname'`, fatal before); calls: "
            + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
            + "; deaf workers 0"
        )
        if code is None:
            assert last is not None and last.output == "ok", last
        else:
            assert code != 0, log[-3000:]


def _restart_twice(server: RedisServer, worker: LoneWorker, slow_runs: Path) -> None:
    """A restart while a slow call runs, then another as soon as the worker's consumer connects
    again: while it starts its consumer anew."""
    started = _lines(slow_runs)
    wait_for(
        lambda: worker.exit_code() is not None or _lines(slow_runs) > started,
        SERVE_S,
        "a slow call to start",
    )
    connected = worker.log().count("Connected to")
    server.stop()
    time.sleep(OUTAGE_S)  # the outage itself, not a wait for something
    server.start()
    wait_for(
        lambda: worker.exit_code() is not None or worker.log().count("Connected to") > connected,
        SERVE_S,
        "the worker to connect again",
    )
    server.stop()
    server.start()


def _lines(path: Path) -> int:
    """Lines in ``path``: the runs a marker file counts."""
    return path.read_text().count("\n") if path.exists() else 0


# --- The result store refusing writes ------------------------------------------------------------


@pytest.mark.timeout(600)
async def test_a_store_that_refuses_writes_delays_answers_and_no_worker_exits(
    settings: WorkerSettings, lone_worker: Callable[..., LoneWorker], report: Report
) -> None:
    workers = [lone_worker(settings, pool) for pool in ("tools", "sandbox")]
    for worker in workers:
        worker.wait_ready()
    per_pool = 20
    with report.case(
        "Faults",
        f"The result store at `maxmemory` with `noeviction` for {REFUSAL_S:g} s while "
        f"{2 * per_pool} calls run on both pools (slow_write, run_bash)",
        "every call answered once the store takes writes again, within its deadline, each run "
        "once; no worker exits",
    ) as row:
        store = redis.Redis.from_url(settings.redis_url)
        async with Dispatcher(settings) as dispatcher:
            caller = Caller(dispatcher, settings, "run-refused")
            workspace = Path(settings.workspace_root) / caller.run_id
            pending = asyncio.gather(
                *(
                    caller("slow_write", {"seconds": 0.3, "marker": f"w{n}"})
                    for n in range(per_pool)
                ),
                *(
                    caller("run_bash", {"command": f"sleep 0.3; echo ran >> b{n}.runs"})
                    for n in range(per_pool)
                ),
            )
            # Refused while calls run, not before any starts.
            await asyncio.to_thread(
                wait_for, lambda: (workspace / "w0.runs").exists(), SERVE_S, "a call to start"
            )
            store.config_set("maxmemory-policy", "noeviction")
            store.config_set("maxmemory", "1")
            try:
                await asyncio.to_thread(
                    wait_for,
                    lambda: any("the result store refused" in w.log() for w in workers),
                    SERVE_S,
                    "a worker to be refused a write",
                )
                await asyncio.sleep(REFUSAL_S)  # the refusal itself, not a wait for something
            finally:
                store.config_set("maxmemory", "0")
            results = await pending
            after = await caller("noop", {})
        runs = [_lines(workspace / f"w{n}.runs") for n in range(per_pool)]
        runs += [_lines(workspace / f"b{n}.runs") for n in range(per_pool)]
        ok = sum(_answered_ok(r) for r in results)
        refused = sum(w.log().count("the result store refused") for w in workers)
        exits = [w.exit_code() for w in workers]
        row.counts = Counts(
            sent=len(results),
            answered=sum(r.worker is not None for r in results),
            lost=sum(r.error_kind == "no_answer" for r in results),
            duplicated=sum(max(0, n - 1) for n in runs),
        )
        row.observed = (
            f"{ok}/{len(results)} answered ok; {refused} refused writes tried again until "
            f"accepted; workers still running: {sum(c is None for c in exits)} of 2, a later "
            f"call answered '{after.output}'; deaf workers 0"
        )
        assert ok == len(results), [r.output for r in results if not _answered_ok(r)]
        assert runs == [1] * len(runs)
        assert exits == [None, None], [w.log()[-3000:] for w in workers]
        assert after.output == "ok"
        for worker in workers:
            await asyncio.to_thread(
                wait_for, worker.live, HEARTBEAT_TTL_S * 4, f"the {worker.pool} worker's heartbeat"
            )
        store.close()


def _answered_ok(result: ToolCallResult) -> bool:
    if result.tool == "slow_write":
        return result.output == "slept 0.3s"
    answer: dict[str, Any] = json.loads(result.output) if not result.is_error else {}
    return answer.get("exit_code") == 0


# --- An unrecoverable error in the consumer ------------------------------------------------------


@pytest.mark.parametrize("stop_hangs", [False, True], ids=["stop-returns", "stop-hangs"])
async def test_an_unrecoverable_error_in_the_consumer_ends_the_worker(
    stop_hangs: bool,
    settings: WorkerSettings,
    lone_worker: Callable[..., LoneWorker],
    report: Report,
) -> None:
    worker = lone_worker(
        settings,
        "tools",
        app="tests.plugins.faulty_consumer",
        env={STOP_HANGS_VARIABLE: "1" if stop_hangs else "0"},
    ).wait_ready()
    how = "its stop never returns (a pool waiting on a child)" if stop_hangs else "it stops"
    with report.case(
        "Faults",
        f"An unrecoverable error in a tools worker's consumer (its event loop raises); {how}",
        "the process exits non-zero (a stop still running after "
        f"{FAILED_STOP_S:g} s is cut short) and its heartbeat is gone: `toolq status` no longer "
        "shows it",
    ) as row:
        os.kill(worker.pid, signal.SIGUSR2)
        withdrawn_first: list[bool] = []

        def heartbeat_gone() -> bool:
            if worker.live():
                return False
            withdrawn_first.append(worker.exit_code() is None)
            return True

        await asyncio.to_thread(wait_for, heartbeat_gone, EXIT_S, "its heartbeat to go")
        code = await asyncio.to_thread(worker.wait_exit)
        log = worker.log()
        row.observed = (
            f"exit {code}; heartbeat gone"
            + (" while the process was still stopping" if withdrawn_first[0] else "")
            + ("; ended by the bound on its stop" if "did not stop within" in log else "")
            + "; deaf workers 0"
        )
        assert "Unrecoverable error: RuntimeError('injected unrecoverable error')" in log
        assert code != 0
        assert not worker.live()
        if stop_hangs:
            assert "did not stop within" in log, log[-3000:]
