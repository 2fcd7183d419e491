"""A conversation's state in Redis, as agents workers and callers change it: each step one script.

Four keys per conversation (``ConversationKeys``): the send that may run (``current``), the runs
started (``attempts``), the lease of the run going on, and the stored answer. The rules they keep:

- one run at a time: a run starts only without a lease, and only for the current send;
- an answer is stored once and handed to the caller, as a tool call's is (``worker.plumbing.jobs``);
  a run whose send was superseded stores none;
- a caller sends again only when no run holds the conversation (the lease is gone) and no answer
  is waiting, so a worker that died costs one more run, never two runs at once.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import redis.asyncio as aioredis

from api.agents.messages import LEASE_TTL_S, ConversationRequest, ConversationResult
from api.state import redis_clients
from worker.contract.keys import conversation_keys
from worker.plumbing.jobs.answers import AsyncAnswerStore, RunGuard

#: What ``current`` holds once the caller has taken the answer: every later message is stale.
WRITTEN = "written"
#: Connections one process opens for its conversations' steps: thousands of conversations
#: starting together wait their turn for one instead of each opening its own (and running into
#: the pool's limit or Redis's).
STORE_CONNECTIONS = 32
#: Seconds a step waits for a connection before it fails as Redis being unreachable.
CONNECTION_WAIT_S = 30.0

# A delivery starts a run: unless its send was superseded, an answer waits, or a run holds the
# conversation. The lease names the attempt and the worker.
_CLAIM = """
local current = redis.call('GET', KEYS[1])
if current and current ~= ARGV[1] then return {'stale', current} end
if not current then redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[4]) end
local stored = redis.call('GET', KEYS[2])
if stored then return {'done', stored} end
local holder = redis.call('GET', KEYS[3])
if holder then return {'busy', holder} end
local attempt = redis.call('INCR', KEYS[4])
redis.call('EXPIRE', KEYS[4], ARGV[4])
holder = attempt .. ' ' .. ARGV[2]
redis.call('SET', KEYS[3], holder, 'EX', ARGV[3])
return {'new', holder}
"""

# Renew the leases still held by their runs; the positions (from 1) of those lost.
_RENEW = """
local lost = {}
for i, key in ipairs(KEYS) do
  if redis.call('GET', key) == ARGV[i + 1] then
    redis.call('EXPIRE', key, ARGV[1])
  else
    table.insert(lost, i)
  end
end
return lost
"""

# A caller's first send: an answer already waiting (the run finished while no caller was there),
# a run going on (adopted, not sent again), or a fresh start from attempt 1.
_PREPARE = """
local stored = redis.call('GET', KEYS[2])
if stored then return {'done', stored} end
local holder = redis.call('GET', KEYS[3])
if holder then return {'running', holder} end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[2])
redis.call('DEL', KEYS[4])
return {'send', ''}
"""

# Send again, only if nothing changed since the caller looked: no run, no answer, no new start.
_SUPERSEDE = """
if redis.call('EXISTS', KEYS[2], KEYS[3]) > 0 then return 0 end
if tonumber(redis.call('GET', KEYS[4]) or '0') ~= tonumber(ARGV[2]) then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'EX', ARGV[3])
return 1
"""


@dataclass(frozen=True, slots=True)
class Claim:
    """How a delivery starts: run it as ``attempt``, or not (``why``), with the stored answer
    when there is one."""

    holder: str | None = None
    stored: ConversationResult | None = None
    why: Literal["stale", "done", "busy", None] = None
    other: str = ""

    @property
    def attempt(self) -> int:
        return attempt_of(self.holder or "0")


@dataclass(frozen=True, slots=True)
class Seen:
    """A conversation as the caller sees it: who runs it, runs started, an answer waiting."""

    holder: str | None
    attempts: int
    answered: bool


@dataclass(frozen=True, slots=True)
class Prepared:
    stored: ConversationResult | None = None
    #: The lease of a run already going on, which the caller waits for instead of sending.
    running: str | None = None


def store_client(redis_url: str) -> aioredis.Redis:
    """A client for ``ConversationStore`` with at most ``STORE_CONNECTIONS`` connections."""
    return redis_clients.store_client(
        redis_url, connections=STORE_CONNECTIONS, wait_s=CONNECTION_WAIT_S
    )


def attempt_of(holder: str) -> int:
    """The attempt in a lease's value, ``<attempt> <worker>``."""
    return int(holder.split(" ", 1)[0])


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class ConversationStore:
    """The scripts above over one ``redis.asyncio`` client, answers kept ``ttl_s``."""

    def __init__(self, client: aioredis.Redis, ttl_s: int) -> None:
        self.redis = client
        self._ttl_s = ttl_s
        self._claim = client.register_script(_CLAIM)
        self._renew = client.register_script(_RENEW)
        self._answers = AsyncAnswerStore(client, ttl_s, conversation_keys.result)
        self._prepare = client.register_script(_PREPARE)
        self._supersede = client.register_script(_SUPERSEDE)

    @staticmethod
    def _keys(conversation_id: str) -> list[str]:
        k = conversation_keys
        return [
            k.current(conversation_id),
            k.result(conversation_id),
            k.lease(conversation_id),
            k.attempts(conversation_id),
        ]

    # -- the agents worker's side ------------------------------------------------------------

    async def claim(self, request: ConversationRequest, worker: str) -> Claim:
        state, value = await self._claim(
            keys=self._keys(request.conversation_id),
            args=[request.task_id, worker, LEASE_TTL_S, self._ttl_s],
        )
        why, text = _text(state), _text(value)
        if why == "new":
            return Claim(holder=text)
        if why == "done":
            return Claim(stored=ConversationResult.model_validate_json(value), why="done")
        return Claim(why="stale" if why == "stale" else "busy", other=text)

    async def renew(self, held: dict[str, str]) -> list[str]:
        """Renew the leases of ``held`` (conversation id -> lease value); the ids whose lease
        another run has, or that expired."""
        if not held:
            return []
        ids = list(held)
        lost = await self._renew(
            keys=[conversation_keys.lease(cid) for cid in ids],
            args=[LEASE_TTL_S, *held.values()],
        )
        return [ids[int(position) - 1] for position in lost]

    async def finish(
        self, request: ConversationRequest, holder: str, result: ConversationResult
    ) -> bool:
        """End the run: its lease goes, and its answer is stored and sent to the caller, in one
        step, so that a caller never sees neither; an answer stored before by another run of the
        send is sent instead. False when its send was superseded: the answer is dropped."""
        cid = request.conversation_id
        guard = RunGuard(
            conversation_keys.current(cid), request.task_id, conversation_keys.lease(cid), holder
        )
        stored = await self._answers.store_once(
            cid, result.model_dump_json(), request.reply_to, guard=guard
        )
        if stored.state == "kept":
            # Another run of the same send answered first: its answer is the conversation's.
            await self._answers.reply(stored.kept, request.reply_to)
        return stored.state != "superseded"

    async def reply(self, reply_to: str | None, result: ConversationResult) -> None:
        """Send a stored answer again, to a delivery whose caller may still wait for it."""
        await self._answers.reply(result.model_dump_json(), reply_to)

    # -- the caller's side -------------------------------------------------------------------

    async def prepare(self, conversation_id: str, task_id: str) -> Prepared:
        state, value = await self._prepare(
            keys=self._keys(conversation_id), args=[task_id, self._ttl_s]
        )
        state = _text(state)
        if state == "done":
            return Prepared(stored=ConversationResult.model_validate_json(value))
        if state == "running":
            return Prepared(running=_text(value))
        return Prepared()

    async def supersede(self, conversation_id: str, task_id: str, seen_attempts: int) -> bool:
        """Make ``task_id`` the send that may run, unless the conversation changed since it was
        seen with ``seen_attempts`` runs and no lease: a run started, or an answer came."""
        keys = self._keys(conversation_id)
        done = await self._supersede(keys=keys, args=[task_id, seen_attempts, self._ttl_s])
        return bool(done)

    async def observe(self, conversation_ids: list[str]) -> list[Seen]:
        """All of them at one instant (one transaction): a run that ends between two reads
        would otherwise look as if it died."""
        async with self.redis.pipeline(transaction=True) as pipe:
            for cid in conversation_ids:
                pipe.get(conversation_keys.lease(cid))
                pipe.get(conversation_keys.attempts(cid))
                pipe.exists(conversation_keys.result(cid))
            values = await pipe.execute()
        return [
            Seen(
                holder=None if lease is None else _text(lease),
                attempts=int(attempts or 0),
                answered=bool(answered),
            )
            for lease, attempts, answered in zip(
                values[0::3], values[1::3], values[2::3], strict=True
            )
        ]

    async def stored(self, conversation_id: str) -> ConversationResult | None:
        raw = await self.redis.get(conversation_keys.result(conversation_id))
        return None if raw is None else ConversationResult.model_validate_json(raw)

    async def consume(self, conversation_id: str) -> None:
        """The caller has the answer: drop it, and make every message of the conversation stale."""
        keys = self._keys(conversation_id)
        async with self.redis.pipeline(transaction=True) as pipe:
            pipe.set(keys[0], WRITTEN, ex=self._ttl_s)
            pipe.delete(keys[1], keys[3])
            await pipe.execute()
