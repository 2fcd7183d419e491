"""The lists of runs and batches, in the API and in the viewer: newest first, a page at a time
behind a cursor, with how many match in all, filtered by status, tag and creation time; each
token's its own. On a real Redis; the stub executor runs nothing, the tests end runs themselves.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis.asyncio as aioredis

from api.http.app import create_app
from api.state.run_end import RunEnd
from api.state.store import ApiStore
from tests.api.http.conftest import StubExecutor, api_settings, emptied_database
from tests.conftest import RedisServer
from worker.contract.keys import run_state_key

#: A database of the session's redis-server that only these tests use.
DATABASE = 12
ALICE = "alice-0123456789abcdef"
BOB = "bob-fedcba9876543210xyz"


@pytest.fixture
async def state(redis_server: RedisServer) -> AsyncIterator[aioredis.Redis]:
    async with emptied_database(redis_server, DATABASE) as client:
        yield client


@pytest.fixture
async def callers(
    state: aioredis.Redis, stub: StubExecutor, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, httpx.AsyncClient]]:
    """Alice and Bob, two tokens of one API."""
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    app = create_app(
        api_settings(api_token=None, api_tokens_file=tokens), redis=state, executor=lambda *_: stub
    )
    transport = httpx.ASGITransport(app=app)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=transport, base_url="http://toolq", headers=bearer(ALICE)
        ) as alice,
        httpx.AsyncClient(transport=transport, base_url="http://toolq", headers=bearer(BOB)) as bob,
    ):
        yield alice, bob


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


async def start_runs(client: httpx.AsyncClient, count: int, **fields: Any) -> list[str]:
    """``count`` runs, the newest first."""
    started = []
    for n in range(count):
        response = await client.post("/v1/runs", json={"prompt": f"question {n}", **fields})
        assert response.status_code == 202, response.text
        started.append(response.json()["id"])
    return started[::-1]


async def every_page(client: httpx.AsyncClient, path: str, **params: Any) -> list[dict[str, Any]]:
    """Each page of a list, following next_cursor to the end."""
    pages = []
    cursor = None
    while True:
        query = params | ({"cursor": cursor} if cursor else {})
        response = await client.get(path, params=query)
        assert response.status_code == 200, response.text
        pages.append(response.json())
        cursor = pages[-1]["next_cursor"]
        if cursor is None:
            return pages


async def test_runs_come_newest_first_a_page_at_a_time_with_the_total(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    alice, _ = callers
    started = await start_runs(alice, 7)

    pages = await every_page(alice, "/v1/runs", limit=3)

    assert [len(page["runs"]) for page in pages] == [3, 3, 1]
    assert {page["total"] for page in pages} == {7}
    assert [run["id"] for page in pages for run in page["runs"]] == started
    first = pages[0]["runs"][0]
    assert first["prompt"] == "question 6" and first["status"] == "queued"
    assert "transcript" not in first  # a list is light: the transcript is the run's own page


async def test_runs_are_filtered_by_status_tag_and_creation_time(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient], state: aioredis.Redis
) -> None:
    alice, _ = callers
    store = ApiStore(state, retention_s=60)
    nightly = await start_runs(alice, 4, tags=["nightly", "model=small"])
    other = await start_runs(alice, 2, tags=["adhoc"])
    for run_id in nightly[:2]:
        assert await store.mark_running(run_id)
        assert await store.finish_run(run_id, RunEnd(status="failed", error="the model API failed"))
    created = {run["id"]: run["created_at"] for run in (await alice.get("/v1/runs")).json()["runs"]}

    failed = (await alice.get("/v1/runs", params={"status": "failed"})).json()
    tagged = (await alice.get("/v1/runs", params={"tag": "model=small", "limit": 1})).json()
    both = (await alice.get("/v1/runs", params={"tag": "nightly", "status": "queued"})).json()
    # Between two runs: a time's microseconds are all a query can give.
    cut = (created[nightly[1]] + created[nightly[2]]) / 2
    since = (await alice.get("/v1/runs", params={"created_after": cut})).json()
    until = (await alice.get("/v1/runs", params={"created_before": iso(cut)})).json()

    assert [run["id"] for run in failed["runs"]] == nightly[:2]
    assert failed["total"] == 2 and failed["runs"][0]["tags"] == ["nightly", "model=small"]
    assert tagged["total"] == 4 and [run["id"] for run in tagged["runs"]] == nightly[:1]
    assert [run["id"] for run in both["runs"]] == nightly[2:]
    assert [run["id"] for run in since["runs"]] == [*other, *nightly[:2]]
    assert [run["id"] for run in until["runs"]] == nightly[2:]


def iso(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).isoformat()


async def test_a_cursor_holds_its_place_when_a_run_of_its_page_expires(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient], state: aioredis.Redis
) -> None:
    alice, _ = callers
    started = await start_runs(alice, 5)
    first = (await alice.get("/v1/runs", params={"limit": 2})).json()
    await state.delete(run_state_key(started[1]))  # the page's last run: expired since

    rest = (await alice.get("/v1/runs", params={"cursor": first["next_cursor"]})).json()

    assert [run["id"] for run in rest["runs"]] == started[2:]
    assert rest["total"] == 4 and rest["next_cursor"] is None


async def test_batches_are_paged_and_filtered_as_runs_are(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient], state: aioredis.Redis
) -> None:
    alice, _ = callers
    store = ApiStore(state, retention_s=60)
    started: list[str] = []
    for n in range(3):
        body = {"items": [{"id": "a", "prompt": "p"}], "tags": [f"round-{n % 2}"]}
        response = await alice.post("/v1/batches", json=body)
        assert response.status_code == 202, response.text
        started.insert(0, response.json()["id"])
    await store.finish_batch(started[0], "failed", error="stopped")

    pages = await every_page(alice, "/v1/batches", limit=2)
    tagged = (await alice.get("/v1/batches", params={"tag": "round-0"})).json()
    failed = (await alice.get("/v1/batches", params={"status": "failed"})).json()

    assert [b["id"] for page in pages for b in page["batches"]] == started
    assert pages[0]["total"] == 3 and pages[0]["batches"][1]["progress"]["total"] == 1
    assert [b["id"] for b in tagged["batches"]] == [started[0], started[2]]
    assert [(b["id"], b["error"]) for b in failed["batches"]] == [(started[0], "stopped")]
    assert "results" not in pages[0]["batches"][0]


async def test_each_token_lists_only_its_own(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    alice, bob = callers
    alices = await start_runs(alice, 3, tags=["shared-tag"])
    bobs = await start_runs(bob, 1, tags=["shared-tag"])

    alice_sees = (await alice.get("/v1/runs", params={"tag": "shared-tag"})).json()
    bob_sees = (await bob.get("/v1/runs")).json()

    assert [run["id"] for run in alice_sees["runs"]] == alices and alice_sees["total"] == 3
    assert [run["id"] for run in bob_sees["runs"]] == bobs and bob_sees["total"] == 1


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cursor": "somewhere"}, "cursor"),
        ({"limit": 0}, "limit"),
        ({"limit": 1001}, "limit"),
        ({"status": "done"}, "status"),
        ({"tag": "two words"}, "tag"),
        ({"created_after": "yesterday"}, "created_after"),
    ],
)
async def test_a_query_the_list_cannot_take_is_refused_naming_it(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient], params: dict[str, Any], field: str
) -> None:
    alice, _ = callers

    response = await alice.get("/v1/runs", params=params)

    assert response.status_code == 422
    assert [error["field"] for error in response.json()["errors"]] == [field]


async def test_a_tag_a_run_cannot_have_is_refused(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    alice, _ = callers

    response = await alice.post("/v1/runs", json={"prompt": "p", "tags": ["a b"]})

    assert response.status_code == 422
    assert [error["field"] for error in response.json()["errors"]] == ["tags.0"]


# --- The viewer ---------------------------------------------------------------------------------


def heading(page: str) -> str:
    found = re.search(r'<h2 id="list-title">([^<]*)</h2>', page)
    assert found, page
    return found.group(1)


def older_link(page: str) -> str | None:
    found = re.search(r'<a href="(/runs\?[^"]*)" rel="next">', page)
    return found.group(1).replace("&amp;", "&") if found else None


async def test_the_viewer_pages_runs_and_filters_them(
    callers: tuple[httpx.AsyncClient, httpx.AsyncClient],
) -> None:
    alice, _ = callers
    started = await start_runs(alice, 27, tags=["nightly"])
    await start_runs(alice, 3, tags=["adhoc"])

    first = (await alice.get("/ui/page/runs")).text
    older = older_link(first)
    assert older is not None
    second = (await alice.get("/ui/page" + older)).text
    tagged = (await alice.get("/ui/page/runs", params={"tag": "nightly", "per_page": 50})).text
    refused = (await alice.get("/ui/page/runs", params={"tag": "two words"})).text

    assert heading(first) == "Runs 1\u201325 of 30"
    assert "Page 1 of 2" in first
    assert heading(second) == "Runs 26\u201330 of 30"
    assert older_link(second) is None and "« Newest" in second
    assert heading(tagged) == "Runs 1\u201327 of 27 matching"
    assert all(f'href="/runs/{run_id}"' in tagged for run_id in started)
    assert "tag &#39;two words&#39; is not a tag" in refused
    assert heading(refused) == "Runs 1\u201325 of 30"
