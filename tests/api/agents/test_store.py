"""The rules a conversation's keys keep, step by step: one run at a time, one answer, a run of a
superseded send answers nobody, and a caller sends again only when nothing runs."""

from __future__ import annotations

import fakeredis
import pytest

from api.agents.messages import LEASE_TTL_S, ConversationRequest, ConversationResult
from api.agents.store import ConversationStore, attempt_of
from worker.contract.keys import conversation_keys as k

CID = "b-12345678-q1-abcdef"


@pytest.fixture
def store() -> ConversationStore:
    return ConversationStore(fakeredis.FakeAsyncRedis(), ttl_s=600)


def request(task_id: str, reply_to: str | None = "toolq:reply:me") -> ConversationRequest:
    return ConversationRequest(
        task_id=task_id,
        conversation_id=CID,
        item={"id": "q1", "prompt": "p"},
        timeout_s=60,
        reply_to=reply_to,
    )


def result(task_id: str, attempt: int, answer: str = "done") -> ConversationResult:
    return ConversationResult(
        conversation_id=CID,
        task_id=task_id,
        attempt=attempt,
        worker="host:1",
        record={"id": "q1", "status": "ok", "answer": answer, "attempts": attempt},
    )


async def replies(store: ConversationStore) -> list[ConversationResult]:
    raw = await store.redis.lrange("toolq:reply:me", 0, -1)
    return [ConversationResult.model_validate_json(r) for r in raw]


async def test_a_sent_conversation_runs_once_and_answers_once(store: ConversationStore) -> None:
    prepared = await store.prepare(CID, "t1")
    assert (prepared.stored, prepared.running) == (None, None)
    claim = await store.claim(request("t1"), "host:1")
    assert claim.holder == "1 host:1" and claim.attempt == 1
    assert 0 < await store.redis.ttl(k.lease(CID)) <= LEASE_TTL_S
    # The same message again (a redelivery) while it runs: not a second run.
    again = await store.claim(request("t1"), "host:2")
    assert (again.holder, again.why, again.other) == (None, "busy", "1 host:1")

    assert await store.finish(request("t1"), "1 host:1", result("t1", 1))

    assert [r.record["answer"] for r in await replies(store)] == ["done"]
    assert not await store.redis.exists(k.lease(CID))
    seen = (await store.observe([CID]))[0]
    assert (seen.holder, seen.attempts, seen.answered) == (None, 1, True)
    # Redelivered after it finished: answered with the stored answer, not run.
    late = await store.claim(request("t1"), "host:2")
    assert late.why == "done" and late.stored is not None
    assert late.stored.record["answer"] == "done"


async def test_an_answer_is_stored_once(store: ConversationStore) -> None:
    await store.prepare(CID, "t1")
    await store.claim(request("t1"), "host:1")
    await store.finish(request("t1"), "1 host:1", result("t1", 1, "first"))
    await store.finish(request("t1"), "1 host:1", result("t1", 1, "second"))
    stored = await store.stored(CID)
    assert stored is not None and stored.record["answer"] == "first"
    assert [r.record["answer"] for r in await replies(store)] == ["first", "first"]


async def test_a_run_whose_worker_died_is_sent_again_as_the_next_attempt(
    store: ConversationStore,
) -> None:
    await store.prepare(CID, "t1")
    await store.claim(request("t1"), "host:1")
    # Sending again while the lease lives is refused: the run may still be going.
    assert not await store.supersede(CID, "t2", seen_attempts=1)
    await store.redis.delete(k.lease(CID))  # as its expiry would, once the worker is gone
    # Refused when the caller's view is out of date: a run started since it looked.
    assert not await store.supersede(CID, "t2", seen_attempts=0)
    assert await store.supersede(CID, "t2", seen_attempts=1)

    # The dead worker's message, redelivered late, belongs to a superseded send.
    stale = await store.claim(request("t1"), "host:3")
    assert (stale.holder, stale.why, stale.other) == (None, "stale", "t2")
    second = await store.claim(request("t2"), "host:2")
    assert second.attempt == 2
    # Should the first run come back to life and finish, nobody waits for its answer.
    assert not await store.finish(request("t1"), "1 host:1", result("t1", 1, "zombie"))
    assert await store.finish(request("t2"), "2 host:2", result("t2", 2))
    assert [r.attempt for r in await replies(store)] == [2]


async def test_a_caller_adopts_a_running_conversation_and_takes_a_finished_one(
    store: ConversationStore,
) -> None:
    await store.prepare(CID, "t1")
    await store.claim(request("t1", reply_to="toolq:reply:gone"), "host:1")
    # A caller that started again finds the run of its predecessor going on.
    prepared = await store.prepare(CID, "t9")
    assert prepared.running == "1 host:1" and attempt_of(prepared.running) == 1
    assert await store.redis.get(k.current(CID)) == b"t1"  # still the one that runs
    await store.finish(request("t1", reply_to="toolq:reply:gone"), "1 host:1", result("t1", 1))
    # Its answer went to the predecessor's list; the new caller takes it from the store.
    prepared = await store.prepare(CID, "t10")
    assert prepared.stored is not None and prepared.stored.record["answer"] == "done"


async def test_a_taken_answer_is_gone_and_every_later_message_is_stale(
    store: ConversationStore,
) -> None:
    await store.prepare(CID, "t1")
    await store.claim(request("t1"), "host:1")
    await store.finish(request("t1"), "1 host:1", result("t1", 1))
    await store.consume(CID)
    assert await store.stored(CID) is None
    assert (await store.claim(request("t1"), "host:2")).why == "stale"
    # Sent afresh (its line was deleted to run it again): attempts start over.
    assert (await store.prepare(CID, "t5")).stored is None
    assert (await store.claim(request("t5"), "host:2")).attempt == 1


async def test_leases_are_renewed_while_held_and_reported_once_lost(
    store: ConversationStore,
) -> None:
    other = "b-12345678-q2-abcdef"
    await store.redis.set(k.lease(CID), "1 host:1", ex=3)
    await store.redis.set(k.lease(other), "2 host:9", ex=3)
    lost = await store.renew({CID: "1 host:1", other: "1 host:1", "gone": "1 host:1"})
    assert sorted(lost) == sorted(["gone", other])
    assert await store.redis.ttl(k.lease(CID)) > 3
    assert await store.renew({}) == []
