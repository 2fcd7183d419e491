"""The scripted model server, seen through the real openai client and raw HTTP."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from openai.types.chat import (
    ChatCompletionChunk,
    ChatCompletionMessageFunctionToolCall,
    ChatCompletionMessageParam,
)
from typer.testing import CliRunner

from api.cli import app
from api.scripted.script import DEFAULT_SCRIPT_PATH, Script
from api.scripted.server import ScriptedServer
from tests.conftest import scripted_server
from worker.tools.bash import RunBashTool
from worker.tools.filesystem import ReadFileTool, WriteFileTool
from worker.tools.interface import ExecutableTool
from worker.tools.search import SearchFilesTool, SearchTextTool
from worker.tools.weather import GetCurrentWeatherTool

FIRST_ANSWER = "the first answer, long enough to be streamed in several pieces"
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "two_answers": [{"content": FIRST_ANSWER}, {"content": "second answer"}],
    "tools_only": [{"tool_calls": [{"name": "read_file", "arguments": {"path": "a.txt"}}]}],
    "echo": [
        {
            "content": "You said {prompt}; the tool said {last_tool_result}.",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "x.txt", "content": "{prompt}"}}
            ],
        }
    ],
    "parallel": [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "ü.txt", "content": 'a "quoted"\n'}},
                {"name": "read_file", "arguments": {"path": "ü.txt"}},
                {"name": "run_bash", "arguments": {"command": "echo {braces} && ls -la /tmp"}},
            ]
        }
    ],
    "fail_500": [{"content": "recovered", "fault": {"kind": "status", "status": 500, "times": 2}}],
    "rate_limited": [
        {
            "content": "after the wait",
            "fault": {"kind": "status", "status": 429, "retry_after": 0.2, "times": 1},
        }
    ],
    "garbage": [{"content": "clean at last", "fault": {"kind": "garbage", "times": 1}}],
    "cut": [{"content": "a long answer " * 8, "fault": {"kind": "cut", "times": 1}}],
    "stall": [{"content": "slow but sure", "fault": {"kind": "stall", "seconds": 5, "times": 1}}],
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScriptedServer]:
    directory = tmp_path_factory.mktemp("scripts")
    with scripted_server(directory, SCRIPTS, default="the default script") as running:
        yield running


@pytest.fixture
async def client(server: ScriptedServer) -> AsyncIterator[openai.AsyncOpenAI]:
    async with openai.AsyncOpenAI(
        base_url=server.base_url, api_key="unused", max_retries=0, timeout=5
    ) as raw_client:
        yield raw_client


@pytest.fixture
async def http(server: ScriptedServer) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=server.base_url, timeout=5) as raw_http:
        yield raw_http


@pytest.fixture
def prompt(request: pytest.FixtureRequest) -> str:
    """A prompt of the test's own, so no two tests share a conversation's fault counter."""
    return f"prompt of {request.node.name}"


def user(text: str) -> ChatCompletionMessageParam:
    return {"role": "user", "content": text}


def assistant(text: str) -> ChatCompletionMessageParam:
    return {"role": "assistant", "content": text}


def function_calls(calls: list[Any] | None) -> list[ChatCompletionMessageFunctionToolCall]:
    assert calls is not None
    assert all(isinstance(call, ChatCompletionMessageFunctionToolCall) for call in calls)
    return calls


async def drain(
    stream: AsyncIterator[ChatCompletionChunk], into: list[ChatCompletionChunk]
) -> None:
    async for chunk in stream:
        into.append(chunk)


async def test_the_step_played_is_the_number_of_assistant_messages(
    client: openai.AsyncOpenAI,
) -> None:
    conversation = [user("hi")]
    answers = []
    for _ in range(4):
        completion = await client.chat.completions.create(
            model="scripted:two_answers", messages=conversation
        )
        answer = completion.choices[0].message.content
        answers.append(answer)
        conversation += [assistant(answer or ""), user("more")]

    # Past the end, the last plain answer is repeated.
    assert answers == [FIRST_ANSWER, "second answer", "second answer", "second answer"]


async def test_a_script_without_plain_answers_ends_with_done(client: openai.AsyncOpenAI) -> None:
    first = await client.chat.completions.create(model="scripted:tools_only", messages=[user("go")])
    after = await client.chat.completions.create(
        model="scripted:tools_only", messages=[user("go"), assistant(""), user("and?")]
    )

    assert first.choices[0].finish_reason == "tool_calls"
    assert after.choices[0].message.content == "Done."
    assert after.choices[0].finish_reason == "stop"


async def test_prompt_and_last_tool_result_are_substituted(client: openai.AsyncOpenAI) -> None:
    tricky = 'a "quoted" {json} \\ prompt'
    messages: list[ChatCompletionMessageParam] = [
        user("an older message"),
        user(tricky),
        {"role": "tool", "tool_call_id": "call_1", "content": "42 bytes"},
    ]

    completion = await client.chat.completions.create(model="scripted:echo", messages=messages)

    message = completion.choices[0].message
    assert message.content == f"You said {tricky}; the tool said 42 bytes."
    arguments = json.loads(function_calls(message.tool_calls)[0].function.arguments)
    assert arguments == {"path": "x.txt", "content": tricky}


async def test_other_model_names_get_the_default_script(client: openai.AsyncOpenAI) -> None:
    completion = await client.chat.completions.create(model="gpt-4o-mini", messages=[user("hi")])

    assert completion.choices[0].message.content == "the default script"
    assert completion.model == "gpt-4o-mini"


async def test_an_unknown_script_is_a_404_naming_the_known_ones(
    client: openai.AsyncOpenAI,
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.chat.completions.create(model="scripted:nope", messages=[user("hi")])

    assert "scripted:nope" in caught.value.message
    assert "scripted:two_answers" in caught.value.message


async def test_a_route_it_does_not_serve_is_an_openai_error_naming_what_it_serves(
    client: openai.AsyncOpenAI, http: httpx.AsyncClient
) -> None:
    with pytest.raises(openai.NotFoundError) as caught:
        await client.embeddings.create(model="scripted", input="hi")
    wrong_method = await http.get("/chat/completions")

    assert "POST /v1/embeddings" in caught.value.message
    assert "POST /v1/chat/completions" in caught.value.message
    assert wrong_method.status_code == 405
    assert wrong_method.headers["allow"] == "POST"
    assert "GET /v1/chat/completions" in wrong_method.json()["error"]["message"]


async def test_models_lists_every_loaded_script(client: openai.AsyncOpenAI) -> None:
    names = {model.id async for model in client.models.list()}

    assert names == {"scripted", *(f"scripted:{name}" for name in SCRIPTS)}


async def test_parallel_tool_calls_and_usage_without_streaming(
    client: openai.AsyncOpenAI,
) -> None:
    completion = await client.chat.completions.create(
        model="scripted:parallel", messages=[user("do three things")]
    )

    calls = function_calls(completion.choices[0].message.tool_calls)
    assert [call.function.name for call in calls] == ["write_file", "read_file", "run_bash"]
    assert len({call.id for call in calls}) == 3
    assert json.loads(calls[0].function.arguments) == {"path": "ü.txt", "content": 'a "quoted"\n'}
    usage = completion.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert usage.completion_tokens > 0
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


async def test_streamed_tool_calls_follow_openai_chunk_format(
    client: openai.AsyncOpenAI,
) -> None:
    stream = await client.chat.completions.create(
        model="scripted:parallel",
        messages=[user("do three things")],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks: list[ChatCompletionChunk] = [chunk async for chunk in stream]

    assert len({chunk.id for chunk in chunks}) == 1
    *answer_chunks, usage_chunk = chunks
    assert usage_chunk.choices == []
    assert usage_chunk.usage is not None
    assert usage_chunk.usage.total_tokens > 0
    assert [c.choices[0].finish_reason for c in answer_chunks[-1:]] == ["tool_calls"]
    assert all(c.choices[0].finish_reason is None for c in answer_chunks[:-1])

    deltas = [delta for chunk in answer_chunks for delta in chunk.choices[0].delta.tool_calls or []]
    for index, expected_name in enumerate(["write_file", "read_file", "run_bash"]):
        first, *rest = [delta for delta in deltas if delta.index == index]
        assert first.id
        assert first.function is not None
        assert first.function.name == expected_name
        assert len(rest) > 1, "arguments should arrive over several chunks"
        assert all(d.id is None and d.function and d.function.name is None for d in rest)
    assert answer_chunks[0].choices[0].delta.role == "assistant"


async def test_streamed_text_ends_with_done(http: httpx.AsyncClient) -> None:
    body = {"model": "scripted:two_answers", "messages": [user("hi")], "stream": True}

    response = await http.post("/chat/completions", json=body)

    assert response.headers["content-type"].startswith("text/event-stream")
    events = [line for line in response.text.split("\n\n") if line]
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(event.removeprefix("data: ")) for event in events[:-1]]
    text = "".join(chunk["choices"][0]["delta"].get("content") or "" for chunk in chunks)
    assert text == FIRST_ANSWER
    assert len(chunks) > 3, "text should arrive over several chunks"
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert all("usage" not in chunk for chunk in chunks), "usage only when asked for"


async def test_a_body_that_is_not_json_gets_a_clear_400(
    http: httpx.AsyncClient, server: ScriptedServer
) -> None:
    before = server.stats()["bad_requests"]

    response = await http.post("/chat/completions", content=b"{not json")
    missing = await http.post("/chat/completions", json={"model": "m"})

    assert response.status_code == 400
    assert response.json()["error"]["message"] == "the request body is not valid JSON"
    assert missing.status_code == 400
    assert "'messages'" in missing.json()["error"]["message"]
    assert server.stats()["bad_requests"] == before + 2


async def test_status_fault_fails_times_per_conversation_then_answers(
    client: openai.AsyncOpenAI, server: ScriptedServer, prompt: str
) -> None:
    before = server.stats()["faults"]["status"]

    for _ in range(2):
        with pytest.raises(openai.InternalServerError):
            await client.chat.completions.create(model="scripted:fail_500", messages=[user(prompt)])
    # Another conversation has a counter of its own.
    with pytest.raises(openai.InternalServerError):
        await client.chat.completions.create(
            model="scripted:fail_500", messages=[user(prompt + " (other)")]
        )
    completion = await client.chat.completions.create(
        model="scripted:fail_500", messages=[user(prompt)]
    )

    assert completion.choices[0].message.content == "recovered"
    assert server.stats()["faults"]["status"] == before + 3


async def test_rate_limit_fault_sends_retry_after(client: openai.AsyncOpenAI, prompt: str) -> None:
    with pytest.raises(openai.RateLimitError) as caught:
        await client.chat.completions.create(model="scripted:rate_limited", messages=[user(prompt)])

    assert caught.value.response.headers["retry-after"] == "0.2"
    assert caught.value.response.headers["retry-after-ms"] == "200"


async def test_garbage_fault_sends_200_with_a_body_that_is_not_json(
    http: httpx.AsyncClient, prompt: str
) -> None:
    body = {"model": "scripted:garbage", "messages": [user(prompt)]}

    broken = await http.post("/chat/completions", json=body)
    healthy = await http.post("/chat/completions", json=body)

    assert broken.status_code == 200
    with pytest.raises(json.JSONDecodeError):
        json.loads(broken.content)
    assert healthy.json()["choices"][0]["message"]["content"] == "clean at last"


async def test_cut_fault_closes_the_connection_mid_body(
    http: httpx.AsyncClient, prompt: str
) -> None:
    body = {"model": "scripted:cut", "messages": [user(prompt)]}

    with pytest.raises(httpx.RemoteProtocolError):
        await http.post("/chat/completions", json=body)
    healthy = await http.post("/chat/completions", json=body)

    assert healthy.json()["choices"][0]["message"]["content"] == "a long answer " * 8


async def test_cut_fault_in_a_stream_stops_before_the_finish(
    client: openai.AsyncOpenAI, prompt: str
) -> None:
    received: list[ChatCompletionChunk] = []
    stream = await client.chat.completions.create(
        model="scripted:cut", messages=[user(prompt)], stream=True
    )

    with pytest.raises(openai.APIConnectionError):
        await drain(stream, received)

    assert received, "some chunks arrive before the cut"
    assert all(chunk.choices[0].finish_reason is None for chunk in received)


async def test_stall_fault_outlasts_a_short_timeout_once(
    client: openai.AsyncOpenAI, server: ScriptedServer, prompt: str
) -> None:
    impatient = client.with_options(timeout=0.2)

    with pytest.raises(openai.APITimeoutError):
        await impatient.chat.completions.create(model="scripted:stall", messages=[user(prompt)])
    completion = await impatient.chat.completions.create(
        model="scripted:stall", messages=[user(prompt)]
    )

    assert completion.choices[0].message.content == "slow but sure"
    assert server.stats()["faults"]["stall"] >= 1


def test_script_files_with_mistakes_are_refused_with_the_file_named(tmp_path: Path) -> None:
    empty_step = tmp_path / "empty_step.json"
    empty_step.write_text('{"steps": [{}]}')
    bad_fault = tmp_path / "bad_fault.json"
    bad_fault.write_text('{"steps": [{"content": "x", "fault": {"kind": "explode"}}]}')

    with pytest.raises(ValueError, match=r"(?s)empty_step\.json.*needs 'content', 'tool_calls'"):
        Script.load(empty_step)
    with pytest.raises(ValueError, match=r"bad_fault\.json"):
        Script.load(bad_fault)
    with pytest.raises(ValueError, match="cannot read script"):
        Script.load(tmp_path / "missing.json")


def test_the_command_line_reports_a_bad_script_and_exits_2(tmp_path: Path) -> None:
    argv = ["scripted-llm", "--port", "0", "--script", str(tmp_path / "missing.json")]

    result = CliRunner().invoke(app, argv)

    assert result.exit_code == 2
    assert "missing.json" in result.stderr


def test_the_demo_calls_each_demo_tool_with_valid_arguments() -> None:
    tools: list[type[ExecutableTool]] = [
        WriteFileTool,
        ReadFileTool,
        SearchTextTool,
        SearchFilesTool,
        RunBashTool,
        GetCurrentWeatherTool,
    ]
    args_of = {tool.name: tool.Args for tool in tools}
    demo = Script.load(DEFAULT_SCRIPT_PATH)

    calls = [call for step in demo.steps for call in step.tool_calls]

    assert {call.name for call in calls} == set(args_of)
    for call in calls:
        args_of[call.name].model_validate(call.arguments)
    assert max(len(step.tool_calls) for step in demo.steps) > 1
    assert demo.steps[-1].content
    assert not demo.steps[-1].tool_calls
