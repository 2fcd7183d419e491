"""Live events of the runs followed in this replica, read once and handed to every follower.

One task reads the event streams of every run someone follows here, with a single XREAD BLOCK
over all of them, and hands each new event to each follower of its run. An open stream thus
holds no Redis connection while it waits: a replica's followers, a thousand or more, cost it one.
The task starts with the first follower and ends when the last one leaves.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterator
from typing import Any

import redis.asyncio as aioredis
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeout
from redis.typing import KeyT, StreamIdT

from api.state.records import EVENTS_MAXLEN, text
from api.state.redis_clients import LONGEST_BLOCK_MS, bounded_block_ms
from api.state.runs import event_entries
from worker.contract.keys import run_events_key

log = logging.getLogger(__name__)

#: A stream id and its event.
Entry = tuple[str, dict[str, Any]]

#: Events one read takes per run.
READ_COUNT = 500
#: Events a follower may have waiting before it is left to catch up from Redis by itself (a
#: client too slow to take them must not make the replica hold a run's whole history for it).
FEED_LIMIT = EVENTS_MAXLEN
#: Seconds the reader waits before reading again after Redis failed.
RETRY_S = 1.0


class Feed:
    """One follower's live events of one run, as the replica's reader hands them out."""

    def __init__(self) -> None:
        self._waiting: list[Entry] = []
        self._arrived = asyncio.Event()
        #: More events came than ``FEED_LIMIT`` while the follower had not taken them: it was
        #: handed no more, and reads what it missed from Redis.
        self.fell_behind = False

    def hand(self, entries: list[Entry]) -> None:
        if self.fell_behind:
            return
        if len(self._waiting) + len(entries) > FEED_LIMIT:
            self.fell_behind = True
            self._waiting.clear()
        else:
            self._waiting.extend(entries)
        self._arrived.set()

    async def take(self, wait_s: float) -> list[Entry]:
        """What arrived since last taken, waiting up to ``wait_s`` when nothing has; events the
        reader read before this follower had caught up may come again (compare their ids)."""
        if not self._waiting and not self.fell_behind:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait_s):
                    await self._arrived.wait()
        self._arrived.clear()
        taken, self._waiting = self._waiting, []
        return taken


class _FollowedRun:
    def __init__(self, after: str) -> None:
        #: Where the reader is in the run's stream: what it reads next comes after this id.
        self.cursor = after
        self.feeds: set[Feed] = set()


class EventHub:
    """Reads the event streams of the runs followed in this replica, and hands their events
    to the followers' feeds; one per app."""

    def __init__(self, client: aioredis.Redis) -> None:
        self._redis = client
        self._block_ms = bounded_block_ms(client, LONGEST_BLOCK_MS)
        self._runs: dict[str, _FollowedRun] = {}
        self._reader: asyncio.Task[None] | None = None
        # Set when the runs to read changed under a read in progress, or the hub is closing.
        self._changed = asyncio.Event()
        self._closing = False

    @contextlib.contextmanager
    def follow(self, run_id: str, after: str) -> Iterator[Feed]:
        """A feed of the events of ``run_id`` that the reader reads from now on. The first
        follower of a run has them from ``after`` on; a later one gets them from where the reader
        is, so it reads those between ``after`` and there from Redis itself once it has joined."""
        run = self._runs.get(run_id)
        if run is None:
            run = self._runs[run_id] = _FollowedRun(after)
            self._changed.set()  # the read in progress does not include this run
        feed = Feed()
        run.feeds.add(feed)
        if not self._closing and (self._reader is None or self._reader.done()):
            self._reader = asyncio.create_task(self._read(), name="toolq-event-hub")
            self._reader.add_done_callback(_log_crash)
        try:
            yield feed
        finally:
            run.feeds.discard(feed)
            if not run.feeds and self._runs.get(run_id) is run:
                del self._runs[run_id]
                if not self._runs:
                    self._changed.set()  # the reader ends, and gives its connection back

    async def close(self) -> None:
        # An event, not a cancellation: redis-py on Python 3.11 can lose a cancellation.
        self._closing = True
        self._changed.set()
        if self._reader is not None:
            await self._reader
            self._reader = None

    async def _read(self) -> None:
        while self._runs and not self._closing:
            self._changed.clear()
            reading = dict(self._runs)
            streams: dict[KeyT, StreamIdT] = {
                run_events_key(run_id): run.cursor for run_id, run in reading.items()
            }
            read = asyncio.ensure_future(
                self._redis.xread(streams, count=READ_COUNT, block=self._block_ms)
            )
            changed = asyncio.ensure_future(self._changed.wait())
            try:
                await asyncio.wait((read, changed), return_when=asyncio.FIRST_COMPLETED)
            finally:
                changed.cancel()
                if not read.done():
                    read.cancel()  # read again, with the runs as they are now
                    await asyncio.wait((read,))
            if read.cancelled():
                continue
            try:
                reply: Any = read.result()
            except RedisTimeout:
                continue  # nothing yet: the socket gave up before Redis said so
            except RedisError as exc:
                log.warning("reading the events of followed runs failed (%s); retrying", exc)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_S):
                        await self._changed.wait()  # or sooner, when closing
                continue
            self._hand_out(reply or [], reading)

    def _hand_out(self, reply: list[Any], reading: dict[str, _FollowedRun]) -> None:
        by_key = {run_events_key(run_id): run_id for run_id in reading}
        for key, items in reply:
            run_id = by_key[text(key)]
            run = reading[run_id]
            if self._runs.get(run_id) is not run or not items:
                continue  # its followers left during the read
            entries = event_entries(items)
            run.cursor = entries[-1][0]
            for feed in run.feeds:
                feed.hand(entries)


def _log_crash(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and (exc := task.exception()) is not None:
        log.error("the reader of followed runs' events stopped", exc_info=exc)
