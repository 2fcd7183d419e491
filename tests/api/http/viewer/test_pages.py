"""The viewer's pages on `toolq serve`'s app: who may read what, and what each page shows.

Redis is fakeredis and nothing executes: the tests write runs and batches into the store.
"""

from __future__ import annotations

import re
from html import unescape
from typing import Any

import fakeredis
import httpx
import pytest
from fastapi import FastAPI

from api.state.run_end import RunEnd
from api.state.store import ApiStore
from tests.api.http.conftest import AUTH, fake_redis, serving

XSS = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'


@pytest.fixture
def store(fake_server: fakeredis.FakeServer) -> ApiStore:
    return ApiStore(fake_redis(fake_server), retention_s=60)


@pytest.fixture
async def anonymous(app: FastAPI) -> Any:
    async with serving(app, headers={}) as browser:
        yield browser


async def finished_batch(store: ApiStore, records: list[dict[str, Any]]) -> str:
    batch_id = "batch-test"
    await store.create_batch(batch_id, total=len(records), concurrency=1, replica="r")
    await store.mark_batch_running(batch_id)
    for record in records:
        await store.batch_item_started(batch_id)
        await store.add_batch_result(batch_id, record)
    await store.finish_batch(batch_id, "succeeded")
    return batch_id


def item(n: int, **extra: Any) -> dict[str, Any]:
    return {
        "id": f"item-{n:03d}",
        "status": "error" if n % 3 == 0 else "ok",
        "answer": f"answer {n}",
        "duration_s": n / 10,
        "usage": {"total_tokens": 100 + n},
        "tool_calls": [],
        "messages": [],
        **extra,
    }


def rows(html: str) -> list[str]:
    """The item ids of a batch page's table, in order."""
    return re.findall(r'<th scope="row"><a href="[^"]*">(item-\d+)</a>', html)


async def test_a_shell_holds_no_data_and_a_page_needs_the_token(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient, store: ApiStore
) -> None:
    batch_id = await finished_batch(store, [item(1, answer="the secret answer")])
    shell = await anonymous.get(f"/batches/{batch_id}")
    assert shell.status_code == 200
    assert 'id="login-form"' in shell.text and "API token" in shell.text
    assert "secret" not in shell.text and "item-001" not in shell.text
    assert "script-src 'self'" in shell.headers["content-security-policy"]
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        refused = await anonymous.get(f"/ui/page/batches/{batch_id}", headers=headers)
        assert refused.status_code == 401
        assert "secret" not in refused.text
    page = await client.get(f"/ui/page/batches/{batch_id}")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert rows(page.text) == ["item-001"]
    assert 'id="login-form"' not in page.text  # the content alone, for the shell's script


async def test_html_in_answers_and_tool_outputs_is_shown_as_text(
    client: httpx.AsyncClient, store: ApiStore
) -> None:
    call = {"id": "c1", "name": "read_file", "arguments": "{}", "output": XSS, "is_error": False}
    messages = [
        {"role": "user", "content": XSS},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": XSS},
        {"role": "assistant", "content": XSS},
    ]
    batch_id = await finished_batch(
        store, [item(1, id=XSS, answer=XSS, tool_calls=[call], messages=messages)]
    )
    for path in (f"/ui/page/batches/{batch_id}", f"/ui/page/batches/{batch_id}/items/1"):
        html = (await client.get(path)).text
        assert "<script>window" not in html and "<img src=x" not in html
        assert "&lt;script&gt;window.pwned = 1&lt;/script&gt;" in html
    item_page = (await client.get(f"/ui/page/batches/{batch_id}/items/1")).text
    assert unescape(item_page).count(XSS) >= 4  # the id, the answer, the output, the messages


async def test_the_items_table_is_filtered_sorted_and_paged_on_the_server(
    client: httpx.AsyncClient, store: ApiStore
) -> None:
    batch_id = await finished_batch(store, [item(n) for n in range(1, 121)])
    base = f"/ui/page/batches/{batch_id}"
    first = (await client.get(base)).text
    assert "Items 1\u201350 of 120" in first and len(rows(first)) == 50
    failed = (await client.get(base, params={"status": "error", "per_page": 25})).text
    assert "Items 1\u201325 of 40 matching" in failed
    assert rows(failed)[:3] == ["item-003", "item-006", "item-009"]
    slow = (
        await client.get(base, params={"sort": "duration", "order": "desc", "q": "answer 1"})
    ).text
    assert rows(slow)[:3] == ["item-120", "item-119", "item-118"]  # "answer 1" is in "answer 120"
    assert "Items 1\u201332 of 32 matching" in slow  # 1, 10-19, 100-120
    second = (await client.get(base, params={"status": "error", "per_page": 25, "page": 2})).text
    assert rows(second)[0] == "item-078" and "Page 2 of 2" in second
    bad = (await client.get(base, params={"min_tokens": "lots"})).text
    assert "fewest tokens &#39;lots&#39; is not a whole number" in bad
    assert (await client.get(f"/ui/page/batches/{batch_id}/items/121")).status_code == 404
    assert (await client.get("/ui/page/batches/batch-nope")).status_code == 404


async def test_the_batches_list_shows_progress_and_the_pass_rate(
    client: httpx.AsyncClient, store: ApiStore
) -> None:
    scored = [item(n, score={"passed": n % 2 == 0, "method": "exact"}) for n in range(1, 5)]
    batch_id = await finished_batch(store, scored)
    html = (await client.get("/ui/page/batches")).text
    assert f'href="/batches/{batch_id}"' in html
    assert 'value="4"' in html  # the progress bar
    assert "50%" in html  # 2 of 4 scored passed


def live_url(html: str) -> str:
    found = re.search(r'data-live="([^"]+)"', html)
    assert found is not None, "the page is not live"
    return unescape(found.group(1))


async def test_a_live_run_is_followed_with_a_ticket_never_the_token(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient, store: ApiStore
) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "go"})).json()["id"]
    other = (await client.post("/v1/runs", json={"prompt": "other"})).json()["id"]
    assert await store.mark_running(run_id)
    first = await store.add_event(
        run_id, {"type": "tool_call_started", "id": "1", "name": "list_dir", "arguments": "{}"}
    )
    page = (await client.get(f"/ui/page/runs/{run_id}")).text
    assert "list_dir" in page and "running" in page
    url = live_url(page)
    assert url.startswith(f"/ui/live/runs/{run_id}?") and f"after={first}" in url
    assert "correct-horse" not in url and "ticket=" in url
    ended = RunEnd(status="succeeded", answer="done", stop_reason="answered")
    assert await store.finish_run(run_id, ended)
    stream = await anonymous.get(url)
    assert stream.status_code == 200
    assert stream.text.count("event: ") == 1 and "event: done" in stream.text
    ticket = url.split("ticket=")[1]
    for wrong in (
        f"/ui/live/runs/{run_id}",
        f"/ui/live/runs/{other}?ticket={ticket}",
        f"/ui/live/runs/{run_id}?ticket=1.{ticket.split('.')[1]}",
    ):
        assert (await anonymous.get(wrong)).status_code == 401
    finished = (await client.get(f"/ui/page/runs/{run_id}")).text
    assert "data-live" not in finished


async def test_a_running_batch_is_live_until_it_ends(
    client: httpx.AsyncClient, anonymous: httpx.AsyncClient, store: ApiStore, app: FastAPI
) -> None:
    replica = app.state.services.replica  # a live replica's: others' work is reaped
    await store.create_batch("batch-live", total=3, concurrency=1, replica=replica)
    await store.mark_batch_running("batch-live")
    url = live_url((await client.get("/ui/page/batches/batch-live")).text)
    await store.finish_batch("batch-live", "failed", error="stopped early")
    stream = await anonymous.get(url)
    assert stream.status_code == 200 and "event: done" in stream.text
    page = (await client.get("/ui/page/batches/batch-live")).text
    assert "stopped early" in page and "data-live" not in page


async def test_the_runs_and_fleet_pages(client: httpx.AsyncClient, app: FastAPI) -> None:
    run_id = (await client.post("/v1/runs", json={"prompt": "what is up"})).json()["id"]
    runs = (await client.get("/ui/page/runs")).text
    assert f'href="/runs/{run_id}"' in runs and "what is up" in runs
    # Metrics name only the tools the fleet serves (the runner tells them when it loads it).
    app.state.services.metrics.know_tools(["read_file"])
    app.state.services.metrics.record_tool_calls(
        [
            {"name": "read_file", "duration_ms": 12.0, "is_error": False},
            {"name": "read_file", "duration_ms": 30.0, "is_error": True, "error_kind": "timeout"},
        ]
    )
    fleet = (await client.get("/ui/page/fleet")).text
    assert "Pool <code>tools</code>" in fleet and "Pool <code>sandbox</code>" in fleet
    assert "tools@test" in fleet
    assert "No live worker serves this pool" in fleet  # the stub fleet has no sandbox worker
    assert "<svg" in fleet and "<rect" in fleet
    assert '<code>read_file</code></th><td class="num">2</td>' in fleet


async def test_the_schema_still_lists_only_the_api(client: httpx.AsyncClient) -> None:
    paths = (await client.get("/openapi.json", headers=AUTH)).json()["paths"]
    assert not any(path.startswith(("/ui", "/batches", "/runs", "/fleet")) for path in paths)
    assert "/" not in paths
