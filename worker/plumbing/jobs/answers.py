"""A job's answer stored once and pushed to its caller's reply list, in one round trip.

A job may run more than once (its message redelivered, or sent again): the first answer stored
is the job's. A later run's is not stored; the one kept comes back, unpushed, for the runner to
reply with once it has checked that it is the job's own. The workers store through the sync
``AnswerStore``, the agents workers through the asyncio ``AsyncAnswerStore``; both run the same
script, with the key strings of their kind of job (``result_key``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import redis
import redis.asyncio as aioredis
from redis.commands.core import AsyncScript, Script

from worker.plumbing.pending_script import PendingScript
from worker.plumbing.store_refusals import until_deadline

# KEYS[1] the job's answer, KEYS[2] the caller's reply list ('' for none), both kept ARGV[2]
# seconds. An answer kept already comes back unpushed, unless it is ARGV[3]: a kept value found
# not to be the job's own, replaced. (GET then SET rather than SET NX GET: the script is atomic
# either way, and this runs on Redis 6.2 too.)
# A job sent again under new send ids, one run at a time, adds KEYS[3], the send that may
# answer (ARGV[4] is this run's), and KEYS[4], the run's lease (ARGV[5] is this run's): the
# lease goes as the run answers, and a send no longer current stores nothing.
_STORE_ONCE = """
if KEYS[4] and redis.call('GET', KEYS[4]) == ARGV[5] then redis.call('DEL', KEYS[4]) end
if KEYS[3] then
  local current = redis.call('GET', KEYS[3])
  if current and current ~= ARGV[4] then return {'superseded', current} end
end
local kept = redis.call('GET', KEYS[1])
if kept and kept ~= ARGV[3] then return {'kept', kept} end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
if KEYS[2] ~= '' then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('EXPIRE', KEYS[2], ARGV[2])
end
return {'stored', ''}
"""


@dataclass(frozen=True, slots=True)
class RunGuard:
    """The run of a job that is sent again under new send ids, one run at a time: its answer
    counts only while its send is the current one, and the lease it runs under goes."""

    current_key: str
    send_id: str
    lease_key: str
    holder: str


@dataclass(frozen=True, slots=True)
class Stored:
    """What came of storing an answer: stored and pushed; another ``kept`` (pushed to nobody);
    or dropped, its send superseded by another (``kept`` is then the current send)."""

    state: Literal["stored", "kept", "superseded"]
    kept: bytes | str = ""


@dataclass(eq=False)
class AnswerStore:
    """The answers of one kind of job (``kind`` names it in logs) on a sync client, kept
    ``ttl_s`` at ``result_key(job_id)``; a write the store refuses is tried again until the
    ``deadline`` given, as long as the caller waits for it."""

    client: redis.Redis
    ttl_s: int
    result_key: Callable[[str], str]
    kind: str
    _script: Script = field(init=False)

    def __post_init__(self) -> None:
        self._script = self.client.register_script(_STORE_ONCE)

    def store_once(
        self,
        job_id: str,
        answer: str,
        reply_to: str | None,
        *,
        replacing: bytes | str = "",
        guard: RunGuard | None = None,
        deadline: float | None = None,
    ) -> Stored:
        """Keep ``answer`` unless an answer other than ``replacing`` is kept, and push it to
        ``reply_to``."""
        keys, args = _script_call(
            self.result_key(job_id), answer, reply_to, self.ttl_s, replacing, guard
        )
        what = f"the answer to {self.kind} {job_id}"
        state, kept = PendingScript(
            self.client, self._script, keys, args, deadline=deadline, what=what
        ).answer()
        return _stored(state, kept)

    def reply(
        self,
        job_id: str,
        answer: bytes | str,
        reply_to: str | None,
        *,
        deadline: float | None = None,
    ) -> None:
        """Push an answer kept before to ``reply_to``, whose caller may still wait for it."""
        if not reply_to:
            return

        def push() -> None:
            # A pipeline forgets its commands when it runs, refused or not: built per try.
            pipe = self.client.pipeline(transaction=False)
            pipe.rpush(reply_to, answer)
            pipe.expire(reply_to, self.ttl_s)
            pipe.execute()

        until_deadline(push, deadline, f"the answer to {self.kind} {job_id}")


@dataclass(eq=False)
class AsyncAnswerStore:
    """``AnswerStore`` on a ``redis.asyncio`` client, each write tried once."""

    client: aioredis.Redis
    ttl_s: int
    result_key: Callable[[str], str]
    _script: AsyncScript = field(init=False)

    def __post_init__(self) -> None:
        self._script = self.client.register_script(_STORE_ONCE)

    async def store_once(
        self, job_id: str, answer: str, reply_to: str | None, *, guard: RunGuard | None = None
    ) -> Stored:
        """As ``AnswerStore.store_once``, for jobs whose stored answers are always their own
        (nothing to replace)."""
        keys, args = _script_call(self.result_key(job_id), answer, reply_to, self.ttl_s, "", guard)
        state, kept = await self._script(keys=keys, args=args)
        return _stored(state, kept)

    async def reply(self, answer: bytes | str, reply_to: str | None) -> None:
        """As ``AnswerStore.reply``."""
        if reply_to:
            async with self.client.pipeline(transaction=False) as pipe:
                pipe.rpush(reply_to, answer)
                pipe.expire(reply_to, self.ttl_s)
                await pipe.execute()


def _script_call(
    result_key: str,
    answer: str,
    reply_to: str | None,
    ttl_s: int,
    replacing: bytes | str,
    guard: RunGuard | None,
) -> tuple[list[str], list[bytes | str | int]]:
    keys = [result_key, reply_to or ""]
    args: list[bytes | str | int] = [answer, ttl_s, replacing]
    if guard is not None:
        keys += [guard.current_key, guard.lease_key]
        args += [guard.send_id, guard.holder]
    return keys, args


def _stored(state: bytes | str, kept: bytes | str) -> Stored:
    text = state.decode() if isinstance(state, bytes) else state
    if text == "stored":
        return Stored("stored")
    return Stored("kept" if text == "kept" else "superseded", kept)
