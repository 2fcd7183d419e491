"""Results stored once per task_id (``worker.plumbing.jobs``), and the start marker that makes
redelivery safe.

A stored result counts only if it is the call's own: sealed with the call's key, derived from
the fleet secret and its id (``worker.contract.fleet_secret``), which no message carries. Anyone
who can write to Redis can put text at a call's result key before the call runs; a worker that
took it for the answer would skip the call and hand that text on, so such a value is replaced,
and said so.
"""

from __future__ import annotations

import logging
from dataclasses import KW_ONLY, dataclass, field
from typing import Any

import redis

from worker.contract.fleet_secret import FleetSecret
from worker.contract.keys import keys
from worker.contract.wire import ToolCallResult, read_start_mark, start_mark
from worker.plumbing.jobs.answers import AnswerStore
from worker.plumbing.pending_script import PendingScript

log = logging.getLogger(__name__)
#: Values not the call's own a worker replaces at its result key before it gives up: each try is
#: a race that whoever writes them must win again.
_UNBOUND_TRIES = 3

# One round trip before a call runs: its stored result if it finished, else the start marker
# (set now, or the mark of whoever set it before). ARGV[3] is a stored value found not to be
# the call's own: it is dropped.
_BEGIN = """
local stored = redis.call('GET', KEYS[1])
if stored and stored ~= ARGV[3] then return {'done', stored} end
if stored then redis.call('DEL', KEYS[1]) end
if redis.call('SET', KEYS[2], ARGV[1], 'NX', 'EX', ARGV[2]) then return {'new', ''} end
return {'cut', redis.call('GET', KEYS[2]) or ''}
"""


@dataclass(frozen=True, slots=True)
class Begin:
    """How a delivery of a call starts: already answered, first run, a run cut short, or
    held by another message of the call."""

    stored: ToolCallResult | None = None
    #: The worker that started this message of the call before (it died mid-call).
    previous: str | None = None
    #: Who holds the call when another message of it started it (the caller sent it again), or
    #: when its caller stopped waiting: this delivery must neither run nor answer it.
    held_by: str | None = None


class ResultStore:
    """Sync access for workers; the caller side reads the same keys through redis.asyncio.

    Answers are sealed with ``secret`` (the fleet's); with none, neither sealed nor checked."""

    def __init__(self, client: redis.Redis, ttl_s: int, secret: FleetSecret | None = None) -> None:
        self._redis = client
        self._ttl_s = ttl_s
        self.secret = secret
        # Named in every answer: an HMAC of the secret, worked out once.
        self._secret_id = None if secret is None else secret.secret_id
        self._answers = AnswerStore(client, ttl_s, keys.result, "call")
        self._begin = client.register_script(_BEGIN)

    def store(
        self, result: ToolCallResult, reply_to: str | None, *, deadline: float | None = None
    ) -> ToolCallResult:
        """Keep the first result of this call, sealed with its key, and send the kept one
        to ``reply_to`` (a redelivered call that ran again still answers with its first
        outcome); a store that refuses is asked again until ``deadline``."""
        seal_key = self.seal_key(result.task_id)
        sealed = self._sealed_with(result, seal_key)
        payload = sealed.model_dump_json()
        unbound: bytes | str = ""
        for _ in range(_UNBOUND_TRIES):
            stored = self._answers.store_once(
                result.task_id, payload, reply_to, replacing=unbound, deadline=deadline
            )
            if stored.state == "stored":
                return sealed
            found = _own_result(stored.kept, seal_key)
            if found is not None:
                self.reply_again(found, reply_to, deadline=deadline)
                return found
            _warn_unbound(result.task_id)
            unbound = stored.kept
        # Written over again each time: the caller still gets the call's own answer.
        self.reply_again(sealed, reply_to, deadline=deadline)
        return sealed

    def seal_key(self, task_id: str) -> str | None:
        """The key that seals call ``task_id``'s answer; None without a secret."""
        return None if self.secret is None else self.secret.seal_key(task_id)

    def sealed(self, result: ToolCallResult) -> ToolCallResult:
        """``result`` sealed as its call's own answer."""
        return self._sealed_with(result, self.seal_key(result.task_id))

    def _sealed_with(self, result: ToolCallResult, seal_key: str | None) -> ToolCallResult:
        if seal_key is None or self._secret_id is None:
            return result
        return result.sealed_with(seal_key, self._secret_id)

    def reply_again(
        self, result: ToolCallResult, reply_to: str | None, *, deadline: float | None = None
    ) -> None:
        if reply_to:
            self._answers.reply(
                result.task_id, result.model_dump_json(), reply_to, deadline=deadline
            )

    def begin_ahead(
        self,
        task_id: str,
        worker: str,
        send_number: int = 1,
        *,
        deadline: float | None = None,
        node: str | None = None,
    ) -> PendingBegin:
        """The stored answer of a finished call, or mark the call started by ``worker`` (of the
        Celery worker ``node``), as message ``send_number`` of the call; a stored answer counts
        if sealed with the call's key.
        Sent now, its answer read by ``PendingBegin.result``: the round trip overlaps whatever
        the caller does in between, which must start nothing of the call's."""
        call = PendingScript(
            self._redis,
            self._begin,
            keys=[keys.result(task_id), keys.started(task_id)],
            args=[start_mark(send_number, worker, node), self._ttl_s, ""],
            deadline=deadline,
            what=f"the start of call {task_id}",
        )
        return PendingBegin(call, send_number=send_number, seal_key=self.seal_key(task_id))


@dataclass(eq=False)
class PendingBegin:
    """A call's ``begin_ahead`` on its way: the script's call written on a connection of its own
    (``PendingScript``: asked again through the client where that fails, until ``deadline``),
    the answer read once, by ``result``."""

    call: PendingScript
    _: KW_ONLY
    send_number: int = 1
    seal_key: str | None = None
    _begin: Begin | None = field(default=None, init=False)

    def result(self) -> Begin:
        """How the call begins; the first call waits for the server's answer."""
        if self._begin is None:
            self._begin = self._settle(self.call.answer())
        return self._begin

    def discard(self) -> None:
        """The call ended before its answer was needed: the connection goes, unread."""
        self.call.discard()

    def _settle(self, answer: Any) -> Begin:
        """How the call begins, from the script's answer: a stored value that is not the
        call's own is dropped and the call begun again."""
        for tries_left in reversed(range(_UNBOUND_TRIES)):
            state, value = answer
            state = _text(state)
            if state == "new":
                return Begin()
            if state == "cut":
                number, starter = read_start_mark(value)
                if number == self.send_number:
                    return Begin(previous=starter)
                return Begin(held_by=starter)
            stored = _own_result(value, self.seal_key)
            if stored is not None:
                return Begin(stored=stored)
            _warn_unbound(self.call.keys[0].removeprefix(keys.result("")))
            if not tries_left:
                break
            self.call.args[2] = value
            answer = self.call.ask_again()
        return Begin(held_by="whoever keeps writing results that are not its own")


def _own_result(raw: bytes | str, seal_key: str | None) -> ToolCallResult | None:
    """The result stored as ``raw`` if it is the call's own: sealed with ``seal_key`` (any
    result, for a call that has none)."""
    try:
        result = ToolCallResult.model_validate_json(raw)
    except ValueError:
        return None
    if seal_key is None or result.is_sealed_with(seal_key):
        return result
    return None


def _warn_unbound(task_id: str) -> None:
    log.warning(
        "call %s: its result key held a value that is not its own (not sealed with its key); "
        "dropped",
        task_id,
    )


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
