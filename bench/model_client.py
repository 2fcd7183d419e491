"""What the model client costs the orchestrator: CPU per chat request through toolq's
``ChatModel`` (the openai client over aiohttp), and through aiohttp alone posting the same body
and reading the same JSON, in a process of its own against the scripted model.

``python -m bench.model_client --llm URL --requests N`` prints one line of JSON. The difference
is the openai client's own share of a request (its request building, headers, retries' and
errors' machinery, response objects), a floor under case 3's orchestrator CPU that toolq does not
write: it is there for as long as toolq asks the model through the openai client.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp

from api.model.client import ChatModel
from api.settings import get_settings

#: Requests in flight at once, as many conversations would have.
IN_FLIGHT = 50
TOOL = {
    "type": "function",
    "function": {
        "name": "noop",
        "description": "Does nothing.",
        "parameters": {"type": "object", "properties": {}},
    },
}


def _messages() -> list[dict[str, Any]]:
    # A prompt of its own: the scripted model plays each conversation's first step.
    return [{"role": "user", "content": f"go {uuid.uuid4().hex}"}]


async def _cpu_ms_per_request(requests: int, one: Callable[[], Awaitable[None]]) -> float:
    async def worker(count: int) -> None:
        for _ in range(count):
            await one()

    await asyncio.gather(*(worker(5) for _ in range(IN_FLIGHT)))  # connections, caches
    share, extra = divmod(requests, IN_FLIGHT)
    before = time.process_time()
    await asyncio.gather(*(worker(share + (n < extra)) for n in range(IN_FLIGHT)))
    return (time.process_time() - before) * 1000 / requests


async def measure(llm_url: str, requests: int) -> dict[str, float]:
    os.environ["OPENAI_BASE_URL"] = llm_url
    os.environ["OPENAI_API_KEY"] = "unused"
    model = ChatModel.from_env(get_settings())

    async def through_openai() -> None:
        await model.complete(model="scripted", messages=_messages(), tools=[TOOL])

    openai_ms = await _cpu_ms_per_request(requests, through_openai)
    await model.aclose()
    url = f"{llm_url}/chat/completions"
    headers = {"Authorization": "Bearer unused"}
    async with aiohttp.ClientSession() as session:

        async def through_aiohttp() -> None:
            body = {"model": "scripted", "messages": _messages(), "tools": [TOOL]}
            async with session.post(url, json=body, headers=headers) as response:
                response.raise_for_status()
                json.loads(await response.read())

        aiohttp_ms = await _cpu_ms_per_request(requests, through_aiohttp)
    return {
        "requests": requests,
        "openai_cpu_ms_per_request": round(openai_ms, 3),
        "aiohttp_cpu_ms_per_request": round(aiohttp_ms, 3),
    }


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.model_client")
    parser.add_argument("--llm", required=True, help="OpenAI base URL of the scripted model")
    parser.add_argument("--requests", type=int, required=True)
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args.llm, args.requests))))


if __name__ == "__main__":
    main()
