"""The image a run or a batch item ran, in the viewer's lists: the runs list and a batch's
items table name it (the digest it ran on hover), a run or item without one says so, and an
image reference is shown as text, never as markup."""

from __future__ import annotations

import re

import fakeredis
import httpx
import pytest

from api.state.store import ApiStore
from tests.api.http.conftest import fake_redis
from tests.api.http.viewer.test_pages import XSS, finished_batch, item

DIGEST = "sha256:" + "ab" * 32


@pytest.fixture
def store(fake_server: fakeredis.FakeServer) -> ApiStore:
    return ApiStore(fake_redis(fake_server), retention_s=60)


def image_cells(html: str) -> list[str]:
    return re.findall(r'<td class="image"[^>]*>([^<]*)</td>', html)


async def test_a_batchs_items_table_names_each_items_image(
    client: httpx.AsyncClient, store: ApiStore
) -> None:
    batch_id = await finished_batch(
        store,
        [
            item(1, image={"reference": "python:3.12-slim", "digest": DIGEST}),
            item(2),
            item(4, image={"reference": XSS, "digest": None}),
        ],
    )
    html = (await client.get(f"/ui/page/batches/{batch_id}")).text
    assert '<th scope="col">Image</th>' in html
    assert image_cells(html)[:2] == ["python:3.12-slim", "\u2014"]
    assert f'title="{DIGEST}">python:3.12-slim</td>' in html
    assert "<script>window" not in html


async def test_the_runs_list_names_each_runs_image(
    client: httpx.AsyncClient, store: ApiStore
) -> None:
    await store.create_run("run-image", "fix the bug", {"image": "swe/astropy:1.0"}, "r")
    await store.create_run("run-plain", "say hi", {}, "r")
    html = (await client.get("/ui/page/runs")).text
    assert '<th scope="col">Image</th>' in html
    assert sorted(image_cells(html)) == sorted(["swe/astropy:1.0", "\u2014"])
