"""The launches each worker process keeps ready: made between calls by one thread of the
process, for any run or for one run alone, taken by a call, ended after it (``launch`` makes one).
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import queue
import threading
import time
from collections.abc import Callable

from worker.exceptions import SandboxError
from worker.sandbox.bounded import join_at_most
from worker.sandbox.config import REAP_BOUND_S, SandboxConfig
from worker.sandbox.ending import Ending
from worker.sandbox.plan import Plan
from worker.sandbox.start.launch import CONFIRM_BOUND_S, Launch, launch, made_now

log = logging.getLogger(__name__)


def _end(used: Launch, ending: Ending) -> None:
    try:
        ending.finish()
    except OSError:
        log.exception("a finished call's namespace could not be ended; its group is removed")
    finally:
        used.close()
        used.group.remove()


#: Work for the launch thread: a launch to make for a plan and configuration, or a call to end.
_Job = tuple[Plan, SandboxConfig] | Callable[[], None]

#: Launches kept ready per plan and configuration. Four: calls that come back to back take the
#: oldest, whose init said long before that it is ready, while the newer ones still wait to join
#: their groups (the kernel's grace period) or, made at the lowest priority, for a free core.
READY = 4
#: Runs whose next call finds a launch made for it alone (``Plan.for_run``), the most recent
#: ones of this process: a conversation's calls keep coming to the same few processes.
RUNS_READY = 4
#: Launches kept ready for each of those runs: a call takes one while the next is made, so
#: calls that come back to back still find one.
EACH_RUN = 2


class Launcher:
    """Keeps launches ready per plan and configuration for this process's next calls.

    One thread of this process makes them all and lives as long as the process: a launch's
    parent-death signal belongs to the thread that started it, so a thread that ended would
    take the launches it made with it.
    """

    def __init__(self) -> None:
        self._ready: dict[tuple[Plan, SandboxConfig], list[Launch]] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()
        self._wanted: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._pending = 0
        self._maker: threading.Thread | None = None
        #: The keys of launches made for one run, least recently used first; each has one.
        self._runs: dict[tuple[Plan, SandboxConfig], None] = {}
        self._making: dict[tuple[Plan, SandboxConfig], int] = {}

    def prepare_for_run(self, plan: Plan, config: SandboxConfig) -> None:
        """Make launches in the background until ``EACH_RUN`` are ready for the run of ``plan``
        (``Plan.for_run``), and let go of those of runs used less recently than the last
        ``RUNS_READY``."""
        stale: list[Launch] = []
        with self._lock:
            self._forget_if_forked()
            key = (plan, config)
            wanted = EACH_RUN - len(self._ready.get(key, [])) - self._making.get(key, 0)
            self._runs.pop(key, None)
            self._runs[key] = None
            while len(self._runs) > RUNS_READY:
                oldest = next(iter(self._runs))
                del self._runs[oldest]
                stale += self._ready.pop(oldest, [])
            for _ in range(max(0, wanted)):
                self._pending += 1
                self._making[key] = self._making.get(key, 0) + 1
                self._wanted.put(key)
            self._start_maker()
        for unused in stale:
            unused.abandon()

    def take(self, plan: Plan, config: SandboxConfig) -> Launch:
        """The oldest launch made ready for ``config``, or a new one."""
        with self._lock:
            self._forget_if_forked()
            ready = self._ready.get((plan, config), [])
            oldest = ready.pop(0) if ready else None
        if oldest is not None and oldest.proc.poll() is None:
            oldest.confirm(time.monotonic() + CONFIRM_BOUND_S)
            if oldest.waiting:
                return oldest
        if oldest is not None:
            oldest.abandon()
        return made_now(plan, config)

    def end_later(self, used: Launch, ending: Ending) -> None:
        """Let a call's init and group end in the background, after its answer went."""
        with self._lock:
            self._forget_if_forked()
            self._start_maker()
            self._wanted.put(functools.partial(_end, used, ending))

    def ready(self, plan: Plan, config: SandboxConfig) -> list[Launch]:
        """The launches ready for ``config`` now, oldest first."""
        with self._lock:
            self._forget_if_forked()
            return list(self._ready.get((plan, config), []))

    def prepare(self, plan: Plan, config: SandboxConfig) -> None:
        """Make launches in the background until ``READY`` are ready for ``config``."""
        with self._lock:
            self._forget_if_forked()
            wanted = READY - len(self._ready.get((plan, config), [])) - self._pending
            for _ in range(max(0, wanted)):
                self._pending += 1
                self._wanted.put((plan, config))
            self._start_maker()

    def _start_maker(self) -> None:
        if self._maker is None:
            self._maker = threading.Thread(
                target=self._make, args=(self._wanted,), name="toolq-launch", daemon=True
            )
            self._maker.start()

    def release(self) -> None:
        """Let every launch kept ready go (their shells exit, their groups are removed)."""
        with self._lock:
            maker, self._maker = self._maker, None
            wanted, self._wanted = self._wanted, queue.SimpleQueue()
        if maker is not None:
            wanted.put(None)
            # Its job at hand is bounded: a launch's confirmation, or a call's ending.
            join_at_most(maker, CONFIRM_BOUND_S + 2 * REAP_BOUND_S, "the thread making launches")
        with self._lock:
            ready, self._ready = [one for kept in self._ready.values() for one in kept], {}
            self._pending = 0
        for unused in ready:
            unused.abandon()

    def _make(self, wanted: queue.SimpleQueue[_Job | None]) -> None:
        while (asked := wanted.get()) is not None:
            if callable(asked):
                asked()
                continue
            plan, config = asked
            try:
                made: Launch | None = launch(plan, config)
            except SandboxError:
                made = None  # the next call makes its own, and says what went wrong
            if made is not None:
                # Here rather than when a call takes it: the init's word and the search for
                # its forked process come off the call's path.
                made.confirm(time.monotonic() + CONFIRM_BOUND_S)
            with self._lock:
                self._pending = max(0, self._pending - 1)
                key = (plan, config)
                if self._making.get(key, 0) > 1:
                    self._making[key] -= 1
                else:
                    self._making.pop(key, None)
                ready = self._ready.setdefault(key, [])
                # Made for one run: kept while the run is among the recent ones.
                recent = key in self._runs or not plan.keep
                room = recent and len(ready) < (EACH_RUN if plan.keep else READY)
                # One that died as it was made (its init never said it is ready) is let go:
                # a call would take it only to abandon it.
                kept = made is not None and room and os.getpid() == self._pid and made.waiting
                if made is not None and kept:
                    ready.append(made)
            if made is not None and not kept:
                made.abandon()

    def _forget_if_forked(self) -> None:
        # A forked child inherits the parent's launches, whose shells are not its children,
        # and not the thread that makes them.
        if os.getpid() != self._pid:
            self._ready, self._pid, self._runs, self._making = {}, os.getpid(), {}, {}
            self._wanted, self._pending, self._maker = queue.SimpleQueue(), 0, None


launcher = Launcher()
# A process that ends normally lets its ready shells go and removes their groups itself; one
# that is killed leaves them to exit by themselves and its groups to the sweep.
atexit.register(launcher.release)
