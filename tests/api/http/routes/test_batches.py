"""``/v1/batches`` on a stub executor: what is accepted and refused, progress and paged results."""

from __future__ import annotations

from typing import Any

import fakeredis
import httpx
import pytest

from api.http.app import create_app
from api.state.store import ApiStore
from tests.api.http.conftest import StubExecutor, api_settings, fake_redis, serving


async def test_a_batch_is_accepted_and_its_progress_and_results_are_paged(
    client: httpx.AsyncClient, stub: StubExecutor, fake_server: fakeredis.FakeServer
) -> None:
    items = [{"id": f"q{n}", "prompt": f"question {n}"} for n in range(3)]
    response = await client.post("/v1/batches", json={"items": items, "concurrency": 2})
    assert response.status_code == 202
    batch_id = response.json()["id"]
    assert [item.id for item in stub.batches[0][1]] == ["q0", "q1", "q2"]
    assert stub.batches[0][2] == 2

    store = ApiStore(fake_redis(fake_server), retention_s=60)
    assert await store.mark_batch_running(batch_id)
    for n, status in enumerate(["ok", "error"]):
        await store.batch_item_started(batch_id)
        await store.add_batch_result(batch_id, {"id": f"q{n}", "status": status})
    await store.batch_item_started(batch_id)

    batch = (await client.get(f"/v1/batches/{batch_id}")).json()
    assert batch["status"] == "running"
    assert batch["progress"] == {"total": 3, "done": 2, "ok": 1, "error": 1, "running": 1}
    assert [r["id"] for r in batch["results"]] == ["q0", "q1"]
    page = (await client.get(f"/v1/batches/{batch_id}", params={"offset": 1, "limit": 5})).json()
    assert [r["id"] for r in page["results"]] == ["q1"]
    bad_page = await client.get(f"/v1/batches/{batch_id}", params={"limit": 0})
    assert bad_page.status_code == 422
    assert bad_page.json()["errors"][0]["field"] == "limit"


@pytest.mark.parametrize(
    ("body", "field", "reason"),
    [
        ({"items": []}, "items", "at least 1 item"),
        ({"items": [{"id": "a"}]}, "items.0.prompt", "Field required"),
        ({"items": [{"id": "a", "prompt": "p"}], "concurrency": 0}, "concurrency", "greater"),
        ({"items": [{"id": "a", "prompt": "p", "enable": ["x"]}]}, "items.0.enable.0", "'x'"),
        (
            {"items": [{"id": "a", "prompt": "p", "files": {"../x": "y"}}]},
            "items.0.files",
            "'../x' leads outside the workspace",
        ),
        (
            {"items": [{"id": "a", "prompt": "p", "artifacts": ["/etc/*"]}]},
            "items.0.artifacts",
            "the pattern '/etc/*' is absolute",
        ),
        (
            {"items": [{"id": "a", "prompt": "p", "check_timeout_s": 1000}]},
            "items.0.check_timeout_s",
            "1000 s is more than this fleet allows",
        ),
        ({"items": [{"id": "a", "prompt": "p", "token_limit": -1}]}, "items.0.token_limit", "0"),
        (
            {"items": [{"id": "a", "prompt": "p", "image": "oci:relative/layout"}]},
            "items.0.image",
            "the path of a oci: image must be absolute",
        ),
    ],
)
async def test_an_invalid_batch_is_refused_naming_the_field(
    client: httpx.AsyncClient, stub: StubExecutor, body: dict[str, Any], field: str, reason: str
) -> None:
    response = await client.post("/v1/batches", json=body)
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert errors[0]["field"] == field
    assert reason in errors[0]["message"]
    assert stub.batches == []


async def test_files_over_the_limit_are_refused(fake_server: fakeredis.FakeServer) -> None:
    stub = StubExecutor()
    app = create_app(
        api_settings(task_files_max_bytes=4),
        redis=fake_redis(fake_server),
        executor=lambda *_: stub,
    )
    items = [{"id": "a", "prompt": "p", "files": {"x": "1234"}}, {"id": "b", "prompt": "p"}]
    items.append({"id": "c", "prompt": "p", "files": {"x": "12", "y": {"base64": "AAAA"}}})
    async with serving(app) as client:
        response = await client.post("/v1/batches", json={"items": items})
    assert response.status_code == 422
    [error] = response.json()["errors"]
    assert error["field"] == "items.2.files"
    assert "5 bytes in all, more than TOOLQ_TASK_FILES_MAX_BYTES (4)" in error["message"]


async def test_items_sharing_an_id_are_refused_naming_the_second(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    # The schema cannot say "unique by id", so the body is one it allows: 409, not 422.
    items = [{"id": "a", "prompt": "p"}, {"id": "b", "prompt": "p"}, {"id": "a", "prompt": "q"}]
    response = await client.post("/v1/batches", json={"items": items})
    assert response.status_code == 409
    errors = response.json()["errors"]
    assert [e["field"] for e in errors] == ["items.2.id"]
    assert "duplicate item id 'a' (first at items.0)" in errors[0]["message"]
    assert "items.2.id: duplicate item id 'a'" in response.json()["detail"]
    assert stub.batches == []
