"""The reply reader: every answer handed over, in one command per round where Redis allows."""

from __future__ import annotations

from typing import Any, cast

import redis.asyncio as aioredis
from redis.exceptions import ResponseError

from worker.plumbing.jobs.replies import read_replies


class FakeStore:
    """A reply list of answers arriving in bursts, on a Redis with or without BLMPOP."""

    def __init__(self, bursts: list[list[bytes]], *, blmpop: bool) -> None:
        self.bursts = bursts
        self.has_blmpop = blmpop
        self.commands: list[str] = []

    def _next(self, count: int) -> list[bytes]:
        if not self.bursts:
            return []
        burst = self.bursts[0]
        taken, self.bursts[0] = burst[:count], burst[count:]
        if not self.bursts[0]:
            self.bursts.pop(0)
        return taken

    async def blmpop(self, timeout: float, numkeys: int, *keys: str, **options: Any) -> Any:
        self.commands.append("BLMPOP")
        if not self.has_blmpop:
            raise ResponseError("unknown command 'BLMPOP', with args beginning with: ")
        taken = self._next(options["count"])
        return [keys[0].encode(), taken] if taken else None

    async def blpop(self, keys: list[str], timeout: float) -> Any:
        self.commands.append("BLPOP")
        taken = self._next(1)
        return (keys[0].encode(), taken[0]) if taken else None

    async def lpop(self, key: str, count: int) -> Any:
        self.commands.append("LPOP")
        return self._next(count) or None


async def read_all(store: FakeStore, expected: int) -> list[bytes | str]:
    delivered: list[bytes | str] = []
    await read_replies(
        cast(aioredis.Redis, store),
        "toolq:reply:x",
        delivered.append,
        others_waiting=lambda: len(delivered) < expected,
        closing=lambda: len(delivered) >= expected,
    )
    return delivered


async def test_each_burst_of_answers_costs_one_blmpop() -> None:
    store = FakeStore([[b"a", b"b", b"c"], [b"d"], [b"e", b"f"]], blmpop=True)

    assert await read_all(store, 6) == [b"a", b"b", b"c", b"d", b"e", b"f"]
    assert store.commands == ["BLMPOP"] * 3


async def test_without_blmpop_answers_come_through_blpop_and_lpop() -> None:
    store = FakeStore([[b"a", b"b", b"c"], [b"d"]], blmpop=False)

    assert await read_all(store, 4) == [b"a", b"b", b"c", b"d"]
    assert store.commands[:2] == ["BLMPOP", "BLPOP"]  # asked once, then never again
    assert "BLMPOP" not in store.commands[1:]
