"""What the conversation client decides on its looks, against a real Redis: the agents worker is
played by the test, through the same store scripts a worker uses."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis

from api.agents.client import ConversationClient
from api.agents.messages import ConversationRequest, ConversationResult
from api.agents.store import ConversationStore
from api.batch.items import BatchItem
from api.conversation.agent_options import AgentOptions
from api.exceptions import NoAgentsError
from api.settings import OrchestratorSettings
from api.state.run_end import RunEnd
from tests.conftest import RedisServer, until
from worker.contract.keys import conversation_keys as k
from worker.contract.keys import keys
from worker.contract.wire import AGENTS_QUEUE

pytestmark = pytest.mark.integration

ITEM = BatchItem(id="q1", prompt="p", model="m")


class Sent:
    """Stands in for the Celery app: keeps what would have gone to the agents queue."""

    def __init__(self) -> None:
        self.requests: list[ConversationRequest] = []

    def send_task(self, name: str, args: list[Any], **options: Any) -> None:
        assert options["queue"] == AGENTS_QUEUE
        assert options["task_id"] == args[0]["task_id"]
        self.requests.append(ConversationRequest.model_validate(args[0]))


@pytest.fixture
def settings(redis_server: RedisServer) -> OrchestratorSettings:
    # A database of these tests' own: no other test's queue or keys.
    url = redis_server.url.rsplit("/", 1)[0] + "/7"
    return OrchestratorSettings(
        broker_url=url, conversation_timeout_s=0.5, reply_margin_s=0.2, model="default"
    )


@pytest.fixture
async def worker_store(settings: OrchestratorSettings) -> AsyncIterator[ConversationStore]:
    client = aioredis.Redis.from_url(settings.redis_url)
    await client.flushdb()
    yield ConversationStore(client, 600)
    await client.aclose()


@pytest.fixture
async def caller(
    settings: OrchestratorSettings, worker_store: ConversationStore
) -> AsyncIterator[tuple[ConversationClient, Sent]]:
    """A client with one agents worker live, and what it sends."""
    sent = Sent()
    await live(worker_store)
    async with client_for(settings, sent) as client:
        yield client, sent


async def live(store: ConversationStore, name: str = "agents-1@host") -> None:
    await store.redis.set(keys.worker_heartbeat(AGENTS_QUEUE, name), "{}", ex=30)


def client_for(settings: OrchestratorSettings, sent: Sent, **options: Any) -> ConversationClient:
    values: dict[str, Any] = {"tick_s": 0.05, "no_workers_grace_s": 0.3, "lost_after_s": 60}
    return ConversationClient(settings, celery_app=sent, **(values | options))


async def sent_run(
    caller: tuple[ConversationClient, Sent], run_id: str
) -> tuple[asyncio.Task[dict[str, Any]], ConversationRequest]:
    """``ITEM`` run as ``run_id`` by the caller's client, and its request once it is sent."""
    client, sent = caller
    running = asyncio.create_task(client.run(ITEM, run_id=run_id))
    await until(lambda: bool(sent.requests), "the send")
    return running, sent.requests[0]


def answer(request: ConversationRequest, attempt: int) -> ConversationResult:
    return ConversationResult(
        conversation_id=request.conversation_id,
        task_id=request.task_id,
        attempt=attempt,
        worker="host:1",
        record={"id": "q1", "status": "ok", "attempts": attempt},
    )


async def test_a_conversation_is_sent_once_and_its_answer_taken(
    settings: OrchestratorSettings, worker_store: ConversationStore
) -> None:
    sent = Sent()
    await live(worker_store)
    async with client_for(settings, sent) as client:
        assert await client.require_workers() == 1
        running = asyncio.create_task(client.run(ITEM, run_id="r-1", default_model="d"))
        await until(lambda: len(sent.requests) == 1, "the send")
        request = sent.requests[0]
        assert request.item == {"id": "q1", "prompt": "p", "model": "m"}
        assert (request.default_model, request.timeout_s, request.reply_to) == (
            "d",
            0.5,
            client.reply_key,
        )
        claim = await worker_store.claim(request, "host:1")
        assert claim.holder is not None
        await worker_store.finish(request, claim.holder, answer(request, 1))
        record = await asyncio.wait_for(running, 5)
    assert record == {"id": "q1", "status": "ok", "attempts": 1}
    assert len(sent.requests) == 1
    assert await worker_store.redis.get(k.current("r-1")) == b"written"


async def test_a_run_whose_worker_died_is_sent_again_then_given_up(
    caller: tuple[ConversationClient, Sent], worker_store: ConversationStore
) -> None:
    client, sent = caller
    running = asyncio.create_task(client.run(ITEM, run_id="r-2"))
    for attempt in (1, 2, 3):
        await until(lambda n=attempt: len(sent.requests) == n, f"send {attempt}")  # type: ignore[misc]
        claim = await worker_store.claim(sent.requests[-1], f"host:{attempt}")
        assert claim.attempt == attempt
        await worker_store.redis.delete(k.lease("r-2"))  # its worker died
    record = await asyncio.wait_for(running, 5)
    assert len({r.task_id for r in sent.requests}) == 3
    assert record["status"] == "error"
    assert record["attempts"] == 3
    assert record["model"] == "m"
    assert "stopped before it answered, 3 times; not run again" in record["error"]


async def test_a_run_past_its_limit_is_answered_with_an_error(
    caller: tuple[ConversationClient, Sent], worker_store: ConversationStore
) -> None:
    running, request = await sent_run(caller, "r-3")
    await worker_store.claim(request, "host:7")  # and then it hangs
    record = await asyncio.wait_for(running, 5)
    assert record["status"] == "error"
    assert record["orchestrator"] == "host:7"
    assert "never answered" in record["error"]
    # The hung run's answer, should it come, belongs to a taken conversation.
    stale = await worker_store.claim(request, "host:8")
    assert stale.why == "stale"


async def test_an_answer_sent_elsewhere_is_taken_from_redis(
    caller: tuple[ConversationClient, Sent], worker_store: ConversationStore
) -> None:
    running, first = await sent_run(caller, "r-4")
    request = first.model_copy(update={"reply_to": "toolq:reply:someone-else"})
    claim = await worker_store.claim(request, "host:1")
    assert claim.holder is not None
    await worker_store.finish(request, claim.holder, answer(request, 1))
    assert (await asyncio.wait_for(running, 5))["attempts"] == 1


async def test_a_send_no_worker_started_with_the_queue_empty_is_sent_again(
    settings: OrchestratorSettings, worker_store: ConversationStore
) -> None:
    sent = Sent()
    await live(worker_store)
    async with client_for(settings, sent, lost_after_s=0.2) as client:
        running = asyncio.create_task(client.run(ITEM, run_id="r-5"))
        await until(lambda: len(sent.requests) == 2, "the send again")
        lost, again = sent.requests
        # The lost message, should it surface, is stale; the new one runs as attempt 1.
        assert (await worker_store.claim(lost, "host:1")).why == "stale"
        claim = await worker_store.claim(again, "host:2")
        assert claim.attempt == 1 and claim.holder is not None
        await worker_store.finish(again, claim.holder, answer(again, 1))
        assert (await asyncio.wait_for(running, 5))["status"] == "ok"


async def test_no_live_agents_worker_is_an_error_not_a_wait(
    settings: OrchestratorSettings, worker_store: ConversationStore
) -> None:
    sent = Sent()
    async with client_for(settings, sent) as client:
        with pytest.raises(NoAgentsError, match="toolq worker --pool agents"):
            await client.require_workers()
        # Told once no worker showed up for the grace (0.3 s here), not waited on until the
        # send is taken for lost (60 s here).
        with pytest.raises(NoAgentsError, match=r"no agents worker is live .* \(none for"):
            await asyncio.wait_for(client.run(ITEM, run_id="r-6"), 30)
    # The conversation was not taken: a later run of the batch sends it afresh.
    assert await worker_store.redis.get(k.current("r-6")) != b"written"
    # Its message, still queued, is dropped by an agents worker that starts later: the caller
    # runs the conversation elsewhere.
    (queued,) = sent.requests
    assert (await worker_store.claim(queued, "host:1")).why == "stale"


async def test_a_run_of_the_http_api_is_sent_as_a_run_and_its_end_returned(
    settings: OrchestratorSettings, worker_store: ConversationStore
) -> None:
    sent = Sent()
    await live(worker_store)
    options = AgentOptions(model="m", run_id="run-7", enable=["noop"])
    async with client_for(settings, sent) as client:
        running = asyncio.create_task(client.run_live("run-7", "hello", options))
        await until(lambda: len(sent.requests) == 1, "the send")
        (request,) = sent.requests
        assert request.item is None and request.run is not None
        assert request.run.prompt == "hello"
        assert AgentOptions.model_validate(request.run.options) == options
        claim = await worker_store.claim(request, "host:1")
        assert claim.holder is not None
        ended = RunEnd(status="succeeded", answer="hi", attempts=1, orchestrator="host:1").line()
        result = answer(request, 1).model_copy(update={"record": ended})
        await worker_store.finish(request, claim.holder, result)
        assert await asyncio.wait_for(running, 5) == ended
