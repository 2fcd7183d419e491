"""ChatModel over HTTP against the scripted server: turns, streams, retries and failures."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Any, cast

import pytest
from aiohttp import web

from api.exceptions import ModelError, UnusableAnswer
from api.local.stack import free_port
from api.model.body import EncodedBodies, chat_body
from api.model.client import (
    PLATFORM_HEADERS,
    ChatModel,
    ModelToolCall,
    ModelTurn,
    RetryPolicy,
    StreamEvent,
    StreamRestarted,
    StreamText,
    TurnDone,
    Usage,
    model_client,
)
from api.model.turn import turn_from_body
from api.scripted.server import ScriptedServer
from api.settings import OrchestratorSettings
from tests.conftest import scripted_server

LONG_TEXT = 'quotes " and \\ backslashes, ünïcödé and {braces} ' * 6
#: A Retry-After past what the client waits for (two minutes).
LONG_RETRY_AFTER_S = 600
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "answer": [{"content": "Hello, {prompt}!"}],
    "tools": [
        {
            "content": "Writing your text down in a file.",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "nötes.txt", "content": LONG_TEXT}}
            ],
        },
        {"content": "Finished: {last_tool_result}"},
    ],
    "parallel": [
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}},
                {"name": "search_files", "arguments": {"pattern": "**/*.py"}},
                {"name": "write_file", "arguments": {"path": "b.txt", "content": "{prompt}"}},
            ]
        }
    ],
    "no_ids": [
        {
            "tool_calls": [
                {"name": "read_file", "arguments": {"path": "a.txt"}, "id": ""},
                {"name": "read_file", "arguments": {"path": "b.txt"}, "id": ""},
            ]
        }
    ],
    "fail_500": [{"content": "recovered", "fault": {"kind": "status", "status": 500, "times": 2}}],
    "always_500": [{"content": "never", "fault": {"kind": "status", "status": 500, "times": 99}}],
    "rate_limited": [
        {
            "content": "after the wait",
            "fault": {"kind": "status", "status": 429, "retry_after": 0.6, "times": 1},
        }
    ],
    "rate_limited_long": [
        {
            "content": "never",
            "fault": {
                "kind": "status",
                "status": 429,
                "retry_after": LONG_RETRY_AFTER_S,
                "times": 1,
            },
        }
    ],
    "garbage": [{"content": "clean at last", "fault": {"kind": "garbage", "times": 1}}],
    "cut": [{"content": LONG_TEXT, "fault": {"kind": "cut", "times": 1}}],
    "stall": [{"content": "slow but sure", "fault": {"kind": "stall", "seconds": 5, "times": 1}}],
}

FAST = RetryPolicy(attempts=3, base_delay=0.01, max_delay=0.05, jitter=0.0)

MakeModel = Callable[..., ChatModel]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedServer]:
    with scripted_server(tmp_path_factory.mktemp("scripts"), SCRIPTS) as running:
        yield running


@pytest.fixture
async def make_model(server: ScriptedServer) -> AsyncIterator[MakeModel]:
    made: list[ChatModel] = []

    def make(
        policy: RetryPolicy = FAST, timeout: float = 5.0, client_retries: int = 0
    ) -> ChatModel:
        # The client toolq's commands make (aiohttp underneath), so every fault below goes
        # through the transport users get.
        client = model_client(
            base_url=server.base_url, api_key="unused", timeout=timeout, max_retries=client_retries
        )
        made.append(ChatModel(client, policy))
        return made[-1]

    yield make
    for model in made:
        await model.aclose()


@pytest.fixture
def model(make_model: MakeModel) -> ChatModel:
    return make_model()


@pytest.fixture
def prompt(request: pytest.FixtureRequest) -> str:
    """A prompt of the test's own, so no two tests share a conversation's fault counter."""
    return f"prompt of {request.node.name}"


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


async def collect(events: AsyncIterator[StreamEvent]) -> list[StreamEvent]:
    return [event async for event in events]


async def ask(model: ChatModel, script: str, text: str, *, streaming: bool) -> ModelTurn:
    """One turn, streamed or not."""
    messages = user(text)
    if streaming:
        return final_turn(await collect(model.stream(model=script, messages=messages)))
    return await model.complete(model=script, messages=messages)


def final_turn(events: list[StreamEvent]) -> ModelTurn:
    assert isinstance(events[-1], TurnDone)
    return events[-1].turn


async def timed(awaitable: Awaitable[ModelTurn]) -> tuple[ModelTurn, float]:
    start = time.perf_counter()
    turn = await awaitable
    return turn, time.perf_counter() - start


async def test_complete_returns_text_tool_calls_and_usage(model: ChatModel, prompt: str) -> None:
    turn = await model.complete(model="scripted:tools", messages=user(prompt), tools=None)

    assert turn.content == "Writing your text down in a file."
    assert turn.finish_reason == "tool_calls"
    [call] = turn.tool_calls
    assert call.name == "write_file"
    assert call.id.startswith("call_")
    assert json.loads(call.arguments) == {"path": "nötes.txt", "content": LONG_TEXT}
    assert turn.usage.prompt_tokens > 0
    assert turn.usage.total_tokens == turn.usage.prompt_tokens + turn.usage.completion_tokens


async def test_assistant_message_continues_the_conversation(model: ChatModel) -> None:
    conversation = user("write it")
    first = await model.complete(model="scripted:tools", messages=conversation)
    conversation.append(first.assistant_message())
    conversation.append(
        {"role": "tool", "tool_call_id": first.tool_calls[0].id, "content": "wrote 300 bytes"}
    )

    second = await model.complete(model="scripted:tools", messages=conversation)

    assert conversation[1]["tool_calls"] == [
        {
            "id": first.tool_calls[0].id,
            "type": "function",
            "function": {"name": "write_file", "arguments": first.tool_calls[0].arguments},
        }
    ]
    assert second.content == "Finished: wrote 300 bytes"
    assert second.tool_calls == []
    assert second.assistant_message() == {"role": "assistant", "content": second.content}


async def test_stream_assembles_text_and_arguments_split_over_many_chunks(
    model: ChatModel, prompt: str
) -> None:
    complete = await model.complete(model="scripted:tools", messages=user(prompt))

    events = await collect(model.stream(model="scripted:tools", messages=user(prompt)))

    turn = final_turn(events)
    deltas = [event.text for event in events if isinstance(event, StreamText)]
    assert len(deltas) > 1
    assert "".join(deltas) == turn.content == "Writing your text down in a file."
    [call] = turn.tool_calls
    assert call.arguments == complete.tool_calls[0].arguments
    assert turn.finish_reason == "tool_calls"
    assert turn.usage == complete.usage


async def test_stream_keeps_parallel_tool_calls_apart_and_in_order(
    model: ChatModel, prompt: str
) -> None:
    turn = final_turn(await collect(model.stream(model="scripted:parallel", messages=user(prompt))))

    assert turn.content is None
    assert [(c.name, json.loads(c.arguments)) for c in turn.tool_calls] == [
        ("read_file", {"path": "a.txt"}),
        ("search_files", {"pattern": "**/*.py"}),
        ("write_file", {"path": "b.txt", "content": prompt}),
    ]
    assert len({call.id for call in turn.tool_calls}) == 3
    assert turn.usage.total_tokens > 0


@pytest.mark.parametrize("streaming", [False, True])
async def test_missing_tool_call_ids_are_generated(model: ChatModel, streaming: bool) -> None:
    turn = await ask(model, "scripted:no_ids", "x", streaming=streaming)

    ids = [call.id for call in turn.tool_calls]
    assert len(ids) == 2
    assert all(call_id.startswith("call_") and len(call_id) > 10 for call_id in ids)
    assert ids[0] != ids[1]


async def test_server_errors_are_retried_until_success(
    model: ChatModel, server: ScriptedServer, prompt: str
) -> None:
    before = server.stats()["requests"]

    turn = await model.complete(model="scripted:fail_500", messages=user(prompt))

    assert turn.content == "recovered"
    assert server.stats()["requests"] - before == 3


async def test_rate_limit_waits_as_long_as_retry_after_says(model: ChatModel, prompt: str) -> None:
    # The client's own first backoff is at most 0.5 s, shorter than the 0.6 s the server asks.
    turn, elapsed = await timed(
        model.complete(model="scripted:rate_limited", messages=user(prompt))
    )

    assert turn.content == "after the wait"
    assert elapsed >= 0.6


async def test_a_retry_after_beyond_two_minutes_is_not_waited_for(
    model: ChatModel, server: ScriptedServer, prompt: str
) -> None:
    before = server.stats()["requests"]

    start = time.perf_counter()
    with pytest.raises(ModelError) as caught:
        await model.complete(model="scripted:rate_limited_long", messages=user(prompt))

    assert time.perf_counter() - start < LONG_RETRY_AFTER_S  # it was not waited for
    assert caught.value.status == 429
    assert caught.value.attempts == 1
    assert "not retried" in str(caught.value)
    assert server.stats()["requests"] - before == 1


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_body_that_is_not_json_is_retried(
    model: ChatModel, prompt: str, streaming: bool
) -> None:
    if streaming:
        events = await collect(model.stream(model="scripted:garbage", messages=user(prompt)))
        assert any(isinstance(event, StreamRestarted) for event in events)
        turn = final_turn(events)
    else:
        turn = await model.complete(model="scripted:garbage", messages=user(prompt))

    assert turn.content == "clean at last"


async def test_a_cut_stream_is_restarted_and_announced(model: ChatModel, prompt: str) -> None:
    events = await collect(model.stream(model="scripted:cut", messages=user(prompt)))

    restarts = [i for i, event in enumerate(events) if isinstance(event, StreamRestarted)]
    assert len(restarts) == 1
    before, after = events[: restarts[0]], events[restarts[0] + 1 :]
    partial = "".join(event.text for event in before if isinstance(event, StreamText))
    replayed = "".join(event.text for event in after if isinstance(event, StreamText))
    assert partial, "text arrived before the cut"
    assert LONG_TEXT.startswith(partial)
    assert partial != LONG_TEXT
    assert replayed == final_turn(events).content == LONG_TEXT
    restart = events[restarts[0]]
    assert isinstance(restart, StreamRestarted)
    assert restart.attempt == 2
    assert "connection" in restart.reason


async def test_a_cut_body_is_retried(model: ChatModel, prompt: str) -> None:
    turn = await model.complete(model="scripted:cut", messages=user(prompt))

    assert turn.content == LONG_TEXT


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_stall_past_the_timeout_is_retried(
    make_model: MakeModel, server: ScriptedServer, prompt: str, streaming: bool
) -> None:
    impatient = make_model(timeout=0.2)
    messages = user(prompt)
    before = server.stats()["requests"]

    if streaming:
        events = await collect(impatient.stream(model="scripted:stall", messages=messages))
        # Nothing had streamed when the request timed out: there is no text to take back.
        assert not any(isinstance(event, StreamRestarted) for event in events)
        turn = final_turn(events)
    else:
        turn = await impatient.complete(model="scripted:stall", messages=messages)

    assert turn.content == "slow but sure"
    assert server.stats()["requests"] - before == 2


@pytest.mark.parametrize("streaming", [False, True])
async def test_giving_up_after_the_last_attempt_says_why(
    model: ChatModel, server: ScriptedServer, prompt: str, streaming: bool
) -> None:
    before = server.stats()["requests"]

    with pytest.raises(ModelError) as caught:
        await ask(model, "scripted:always_500", prompt, streaming=streaming)

    error = caught.value
    assert error.attempts == 3
    assert error.status == 500
    assert "after 3 attempts" in str(error)
    assert "last status 500" in str(error)
    assert server.stats()["requests"] - before == 3


@pytest.mark.parametrize("streaming", [False, True])
async def test_a_refused_request_is_not_retried(
    model: ChatModel, server: ScriptedServer, streaming: bool
) -> None:
    before = server.stats()["requests"]

    with pytest.raises(ModelError) as caught:
        await ask(model, "scripted:missing", "x", streaming=streaming)

    assert caught.value.status == 404
    assert caught.value.attempts == 1
    assert "not retried" in str(caught.value)
    assert "scripted:missing" in str(caught.value)
    assert server.stats()["requests"] - before == 1


async def test_the_policy_bounds_the_clients_own_retries(
    make_model: MakeModel, server: ScriptedServer, prompt: str
) -> None:
    once = make_model(RetryPolicy(attempts=1), client_retries=3)
    before = server.stats()["requests"]

    with pytest.raises(ModelError):
        await once.complete(model="scripted:always_500", messages=user(prompt))

    assert server.stats()["requests"] - before == 1


async def test_two_hundred_concurrent_conversations_on_one_server(
    model: ChatModel, server: ScriptedServer
) -> None:
    before = server.stats()["requests"]

    async def converse(number: int) -> ModelTurn:
        events = model.stream(model="scripted:parallel", messages=user(f"conversation {number}"))
        return final_turn(await collect(events))

    turns = await asyncio.gather(*(converse(number) for number in range(200)))

    written = [json.loads(turn.tool_calls[2].arguments)["content"] for turn in turns]
    assert written == [f"conversation {number}" for number in range(200)]
    assert server.stats()["requests"] - before == 200


def test_retry_delays_grow_exponentially_up_to_the_cap() -> None:
    policy = RetryPolicy(base_delay=0.5, max_delay=8.0, jitter=0.0)
    jittered = RetryPolicy(base_delay=0.5, max_delay=8.0, jitter=0.25)

    assert [policy.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 8.0]
    assert all(1.0 <= jittered.delay(2) <= 1.25 for _ in range(50))


def test_a_policy_without_attempts_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 1"):
        RetryPolicy(attempts=0)


def test_usage_adds_up() -> None:
    assert Usage(1, 2, 3) + Usage(10, 20, 30) == Usage(11, 22, 33)


def test_a_completion_body_is_read_into_a_turn() -> None:
    body = {
        "choices": [
            {
                "message": {
                    "content": None,
                    "tool_calls": [
                        {
                            "id": "c1",
                            "type": "function",
                            "function": {"name": "a", "arguments": "{}"},
                        },
                        {"type": "function", "function": {"name": "b"}},
                    ],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": 2},
    }

    turn = turn_from_body(json.dumps(body).encode())

    first, second = turn.tool_calls
    assert first == ModelToolCall("c1", "a", "{}")
    assert (second.name, second.arguments) == ("b", "")
    assert second.id.startswith("call_")  # the provider sent none
    assert (turn.content, turn.finish_reason) == (None, "tool_calls")
    assert turn.usage == Usage(3, 2, 0)


@pytest.mark.parametrize(
    "body",
    [
        b"[]",
        b'{"choices": []}',
        b'{"choices": [{}]}',
        b'{"choices": [{"message": {"content": 3}}]}',
        b'{"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}',
        b'{"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "3"}}',
        b"\xff\xfe\x00",
    ],
)
def test_a_body_that_holds_no_turn_is_unusable(body: bytes) -> None:
    with pytest.raises((UnusableAnswer, json.JSONDecodeError)):
        turn_from_body(body)


def test_a_body_is_the_clients_json_with_each_tool_list_encoded_once() -> None:
    bodies = EncodedBodies()
    messages = user("hi")
    tools: list[dict[str, Any]] = [
        {"type": "function", "function": {"name": "a", "parameters": {"type": "object"}}}
    ]
    expected = chat_body("m", messages, json.loads(json.dumps(tools)), stream=False)

    first = bodies.body("m", messages, tools, stream=False)["content"]
    streamed = bodies.body("m", messages, [dict(tools[0])], stream=True)["content"]
    tools[0]["function"]["description"] = "changed since"
    changed = bodies.body("m", messages, tools, stream=False)["content"]

    assert json.loads(first) == expected
    assert json.loads(streamed) == chat_body("m", messages, expected["tools"], stream=True)
    assert json.loads(changed)["tools"] == tools
    assert bodies.body("m", messages, [], stream=False)["content"] == (
        b'{"model":"m","messages":[{"role":"user","content":"hi"}]}'
    )


def test_tool_calls_are_sent_back_in_openai_format() -> None:
    turn = ModelTurn(content=None, tool_calls=[ModelToolCall("call_1", "read_file", '{"p": 1}')])

    assert turn.assistant_message() == {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"p": 1}'},
            }
        ],
    }


async def test_from_env_talks_to_a_keyless_server(
    server: ScriptedServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", server.base_url)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    async with ChatModel.from_env(OrchestratorSettings(llm_max_retries=2)) as from_env:
        turn = await from_env.complete(model="scripted:answer", messages=user("env"))

    assert turn.content == "Hello, env!"
    assert from_env.policy.attempts == 3


def test_from_env_without_key_or_server_says_what_to_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)

    with pytest.raises(ModelError, match="OPENAI_API_KEY is not set"):
        ChatModel.from_env(OrchestratorSettings())


@pytest.mark.parametrize("url", ["not-a-url", "ftp://models/v1", "localhost:11434/v1"])
def test_a_url_that_cannot_be_a_model_api_is_refused_before_any_request(
    url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_BASE_URL", url)
    monkeypatch.setenv("OPENAI_API_KEY", "test")

    with pytest.raises(ModelError, match="OPENAI_BASE_URL must be an http:// or https:// URL"):
        ChatModel.from_env(OrchestratorSettings())


@pytest.mark.parametrize("streaming", [False, True])
@pytest.mark.parametrize(
    ("host", "said"),
    [
        ("127.0.0.1:{port}", "the connection was refused (Cannot connect to host 127.0.0.1:{port}"),
        ("toolq-model.invalid", "the host name could not be resolved (Cannot connect to host"),
    ],
)
async def test_a_server_that_cannot_be_reached_is_not_called_slow(
    host: str, said: str, streaming: bool
) -> None:
    port = free_port()
    client = model_client(
        base_url=f"http://{host.format(port=port)}/v1", api_key="k", timeout=5, max_retries=0
    )
    async with ChatModel(client) as unreachable:
        with pytest.raises(ModelError) as failed:
            await ask(unreachable, "m", "hi", streaming=streaming)

    message = str(failed.value)
    assert message.startswith(f"model request failed after 1 attempt: {said.format(port=port)}")
    assert "timed out" not in message


class RecordingProvider:
    """An OpenAI-compatible endpoint that keeps every request's headers and JSON body."""

    COMPLETION: dict[str, Any] = {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": 0,
        "model": "m",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ok"},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }
    CHUNKS: list[dict[str, Any]] = [
        {
            "id": "chatcmpl-1",
            "object": "chat.completion.chunk",
            "created": 0,
            "model": "m",
            "choices": [{"index": 0, "delta": {"content": "ok"}, "finish_reason": "stop"}],
        }
    ]

    def __init__(self) -> None:
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self._runner: web.AppRunner | None = None
        self.base_url = ""

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body))
        if not body.get("stream"):
            return web.json_response(self.COMPLETION)
        response = web.StreamResponse(headers={"content-type": "text/event-stream"})
        await response.prepare(request)
        for chunk in self.CHUNKS:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        return response

    async def __aenter__(self) -> RecordingProvider:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._answer)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = self._runner.addresses[0][1]
        self.base_url = f"http://127.0.0.1:{port}/v1"
        return self

    async def __aexit__(self, *_: object) -> None:
        assert self._runner is not None
        await self._runner.cleanup()


# Headers that differ between any two requests, whoever sends them.
VOLATILE_HEADERS = {"content-length", "x-stainless-read-timeout"}


@pytest.mark.parametrize("streaming", [False, True], ids=["complete", "stream"])
async def test_requests_are_what_the_sdks_own_create_sends(streaming: bool) -> None:
    """ChatModel posts its wire-format body itself: same body, same key, same headers but the
    client's description of its own platform, which toolq leaves out."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": 'ünïcödé " and {braces}'},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "text"},
    ]
    tools: list[dict[str, Any]] = [
        {
            "type": "function",
            "function": {
                "name": "read_file",
                "description": "Read a file.",
                "parameters": {"type": "object", "properties": {"path": {"type": "string"}}},
            },
        }
    ]
    async with RecordingProvider() as provider:
        client = model_client(
            base_url=provider.base_url, api_key="sk-secret", timeout=5, max_retries=0
        )
        model = ChatModel(client, FAST)
        try:
            if streaming:
                turn = final_turn(
                    await collect(model.stream(model="m", messages=messages, tools=tools))
                )
                sdk_stream = await client.chat.completions.create(
                    model="m",
                    messages=cast(Any, messages),
                    tools=cast(Any, tools),
                    stream=True,
                    stream_options={"include_usage": True},
                )
                async with sdk_stream:
                    [_ async for _ in sdk_stream]
            else:
                turn = await model.complete(model="m", messages=messages, tools=tools)
                await client.chat.completions.create(
                    model="m",
                    messages=cast(Any, messages),
                    tools=cast(Any, tools),
                )
        finally:
            await model.aclose()

    assert turn.content == "ok"
    (ours, our_body), (sdks, sdk_body) = provider.requests
    assert our_body == sdk_body
    assert our_body["messages"] == messages
    assert our_body.get("stream", False) is streaming
    assert ours["authorization"] == "Bearer sk-secret"
    platform = {name.lower() for name in PLATFORM_HEADERS}
    assert platform <= set(sdks)
    assert not platform & set(ours)
    assert {k: v for k, v in ours.items() if k not in VOLATILE_HEADERS} == {
        k: v for k, v in sdks.items() if k not in VOLATILE_HEADERS | platform
    }


async def test_no_tools_sends_no_tools_parameter() -> None:
    async with RecordingProvider() as provider:
        client = model_client(base_url=provider.base_url, api_key="k", timeout=5, max_retries=0)
        async with ChatModel(client, FAST) as model:
            await model.complete(model="m", messages=user("hi"), tools=[])

    [(_, body)] = provider.requests
    assert body == {"model": "m", "messages": user("hi")}
