"""The viewer in a real headless Chromium, on a real `toolq serve`, real workers and a scripted
model: signing in, a finished batch of 300 items, a run followed live, the fleet, and HTML in
answers and outputs shown as text."""

from __future__ import annotations

import re
import subprocess
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from bench.viewer import write_results
from tests.api.http.conftest import TOKEN
from tests.api.http.serving import TOOLQ, Replica
from tests.api.http.viewer.conftest import Screenshots
from tests.bounded import read_line
from tests.conftest import wait_for

if TYPE_CHECKING:
    from playwright.sync_api import Page

# The first test waits for a batch of 300 conversations as well.
pytestmark = [pytest.mark.integration, pytest.mark.browser, pytest.mark.timeout(300)]

XSS = '<script>window.pwned = 1</script><img src=x onerror="window.pwned = 2">'
ITEMS = 300
#: Runs for the runs list: more than its first page of 25.
PAGED_RUNS = 30
SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "answer": [{"content": "All fine: {prompt}"}],
    "notes": [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "n.txt", "content": "{prompt}"}}
            ]
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "n.txt"}}]},
        {"content": "The note says: {last_tool_result}"},
    ],
    # A tool call, then the model API refuses: an item that failed after doing something.
    "fails_late": [
        {
            "content": "Writing first.",
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "late.txt", "content": "{prompt}"}}
            ],
        },
        {"content": "never said", "fault": {"kind": "status", "status": 400}},
    ],
    "html": [
        {
            "content": XSS,
            "tool_calls": [{"name": "write_file", "arguments": {"path": "x.html", "content": XSS}}],
        },
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "x.html"}}]},
        {"content": XSS},
    ],
    "live": [
        {
            "content": "Step one.",
            "tool_calls": [
                {"name": "run_bash", "arguments": {"command": "sleep 3; echo first-output"}}
            ],
        },
        {
            "content": "Step two.",
            "tool_calls": [
                {"name": "run_bash", "arguments": {"command": "sleep 3; echo second-output"}}
            ],
        },
        {"content": "Finished, live."},
    ],
}


def script_of(n: int) -> str:
    if n == 7:
        return "html"
    return {3: "fails_late", 5: "notes"}.get(n % 10, "answer")


@pytest.fixture(scope="module")
def batch(server: Replica) -> str:
    """A finished batch of 300 items: most answer, some write notes, a tenth fail."""
    items = [
        {"id": f"item-{n:03d}", "prompt": f"Note {n}", "model": f"scripted:{script_of(n)}"}
        for n in range(ITEMS)
    ]
    response = server.client.post("/v1/batches", json={"items": items, "concurrency": 50})
    assert response.status_code == 202, response.text
    batch_id: str = response.json()["id"]

    def finished() -> bool:
        state = server.client.get(f"/v1/batches/{batch_id}", params={"limit": 1}).json()
        return bool(state["status"] not in ("queued", "running"))

    wait_for(finished, 120, f"batch {batch_id} to finish")
    progress = server.client.get(f"/v1/batches/{batch_id}").json()["progress"]
    assert progress == {"total": ITEMS, "done": ITEMS, "ok": 270, "error": 30, "running": 0}
    return batch_id


def sign_in(page: Page, url: str, token: str = TOKEN) -> None:
    page.goto(url)
    page.get_by_label("API token").fill(token)
    page.get_by_role("button", name="Sign in").click()


def test_log_in_filter_the_failed_items_and_read_one(
    page: Page, server: Replica, batch: str, screenshots: Screenshots
) -> None:
    from playwright.sync_api import expect

    page.goto(server.url + "/")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    screenshots.take(page, "login")
    sign_in(page, server.url + "/")
    expect(page.get_by_role("heading", name="Batches", exact=True)).to_be_visible()
    page.get_by_role("link", name=batch).click()
    expect(page.get_by_role("heading", name=f"Items 1\u201350 of {ITEMS}")).to_be_visible()
    expect(page.locator("[data-region=progress]")).to_contain_text("270 ok, 30 failed")
    screenshots.take(page, "batch")

    page.get_by_label("Status").select_option("error")
    page.get_by_role("button", name="Filter").click()
    expect(page.get_by_role("heading", name="Items 1\u201330 of 30 matching")).to_be_visible()
    assert page.url.endswith(f"/batches/{batch}?status=error&per_page=50")  # one to share
    statuses = page.locator("table.items tbody td:nth-child(3)").all_inner_texts()
    assert statuses == ["error"] * 30
    screenshots.take(page, "batch-failed")

    first = page.locator("table.items tbody th a").first
    item_id = first.inner_text()
    first.click()
    expect(page.get_by_role("heading", level=1)).to_contain_text(item_id)
    call = page.get_by_role("article", name="Tool call write_file")
    expect(call).to_be_visible()
    expect(call).to_contain_text('"path": "late.txt"')
    expect(call).to_contain_text("Wrote")
    expect(call.get_by_text("Worker")).to_be_visible()
    expect(page.locator("main p.problem")).to_contain_text("400")
    screenshots.take(page, "item")
    page.get_by_role("link", name="Back to the results").click()
    expect(page.get_by_role("heading", name="Items 1\u201330 of 30 matching")).to_be_visible()


def test_a_run_shows_its_tool_calls_as_they_happen(
    page: Page, server: Replica, screenshots: Screenshots
) -> None:
    from playwright.sync_api import expect

    sign_in(page, server.url + "/runs")
    expect(page.get_by_role("heading", name="Runs", exact=True)).to_be_visible()
    body = {
        "prompt": "Go step by step",
        "options": {"model": "scripted:live", "enable": ["run_bash"]},
    }
    run_id = server.client.post("/v1/runs", json=body).json()["id"]
    page.goto(f"{server.url}/runs/{run_id}")
    expect(page.get_by_role("heading", name=f"Run {run_id}")).to_be_visible()
    page.evaluate("window.sameDocument = true")  # gone if anything below reloads the page
    assert "second-output" not in page.locator("main").inner_text()  # the run is still going
    expect(page.locator("main")).to_contain_text("first-output", timeout=30_000)
    screenshots.take(page, "run")  # mid-run: the second call may still be running
    expect(page.locator("main")).to_contain_text("second-output", timeout=30_000)
    expect(page.locator("main .badge.status-succeeded")).to_be_visible(timeout=30_000)
    expect(page.get_by_role("article", name="Tool call run_bash")).to_have_count(2)
    expect(page.locator("main")).to_contain_text("Exit code 0")
    assert page.evaluate("window.sameDocument") is True


def test_the_runs_list_pages_and_filters_on_the_server(
    page: Page, server: Replica, screenshots: Screenshots
) -> None:
    from playwright.sync_api import expect

    tag = f"paging-{uuid.uuid4().hex[:6]}"
    for n in range(PAGED_RUNS):
        body = {
            "prompt": f"Question {n}",
            "options": {"model": "scripted:answer"},
            "tags": [tag, "even" if n % 2 == 0 else "odd"],
        }
        assert server.client.post("/v1/runs", json=body).status_code == 202

    def all_answered() -> bool:
        params: dict[str, str | int] = {"tag": tag, "status": "succeeded", "limit": 1}
        return bool(server.client.get("/v1/runs", params=params).json()["total"] == PAGED_RUNS)

    wait_for(all_answered, 120, f"the {PAGED_RUNS} runs to answer")
    sign_in(page, f"{server.url}/runs?tag={tag}")
    first_page = page.get_by_role("heading", name=f"Runs 1\u201325 of {PAGED_RUNS} matching")
    expect(first_page).to_be_visible()
    expect(page.locator("main table tbody tr")).to_have_count(25)
    expect(page.locator("main")).to_contain_text("Page 1 of 2")
    screenshots.take(page, "runs")

    page.get_by_role("link", name="Older").click()
    expect(
        page.get_by_role("heading", name=f"Runs 26\u2013{PAGED_RUNS} of {PAGED_RUNS} matching")
    ).to_be_visible()
    expect(page.locator("main table tbody tr")).to_have_count(PAGED_RUNS - 25)
    page.get_by_role("link", name="Newest").click()
    expect(first_page).to_be_visible()

    page.get_by_label("Tag").fill("odd")
    page.get_by_label("Status").select_option("succeeded")
    page.get_by_label("Rows").select_option("50")
    page.get_by_role("button", name="Filter").click()
    # Every odd run of this test, and those of no other test (they have no tags).
    odd = PAGED_RUNS // 2
    expect(page.get_by_role("heading", name=f"Runs 1\u2013{odd} of {odd} matching")).to_be_visible()
    assert "tag=odd" in page.url and "status=succeeded" in page.url
    tags = page.locator("main table tbody td:nth-child(3)").all_inner_texts()
    assert len(tags) == odd and all("odd" in cell for cell in tags)


def test_the_fleet_page_shows_both_pools(
    page: Page, server: Replica, batch: str, screenshots: Screenshots
) -> None:
    from playwright.sync_api import expect

    sign_in(page, server.url + "/fleet")
    for pool in ("tools", "sandbox"):
        section = page.get_by_role("region", name=f"Pool {pool}")
        expect(section).to_contain_text("1 live worker")
        expect(section.locator("tbody tr")).to_have_count(1)
        expect(section).to_contain_text("s ago")
    expect(page.get_by_role("region", name="Pool tools")).to_contain_text("write_file")
    expect(page.get_by_role("region", name="Pool sandbox")).to_contain_text("run_bash")
    expect(
        page.get_by_role("img", name="Tool calls per second, and the share that failed")
    ).to_be_visible()
    latency = page.get_by_role("region", name="Latency by tool")
    expect(latency.get_by_role("row", name=re.compile(r"^write_file"))).to_be_visible()
    screenshots.take(page, "fleet")


def test_a_missing_or_wrong_token_shows_the_login_and_no_data(
    page: Page, server: Replica, batch: str
) -> None:
    from playwright.sync_api import expect

    seen: list[str] = []
    page.on("response", lambda response: seen.append(f"{response.status} {response.url}"))
    page.goto(f"{server.url}/batches/{batch}")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.locator("main")).to_be_empty()
    sign_in(page, f"{server.url}/batches/{batch}", token="not-the-token")
    expect(page.get_by_role("alert")).to_contain_text("refused that token")
    expect(page.get_by_role("heading", name="Sign in")).to_be_visible()
    expect(page.locator("main")).to_be_empty()
    assert page.evaluate("sessionStorage.length") == 0
    assert f"401 {server.url}/ui/page/batches/{batch}" in seen
    assert not any(entry.startswith("200") and "/ui/page/" in entry for entry in seen)
    assert not any(TOKEN in entry or "not-the-token" in entry for entry in seen)


def test_html_in_answers_and_outputs_is_shown_as_text(
    page: Page, server: Replica, batch: str
) -> None:
    from playwright.sync_api import expect

    sign_in(page, f"{server.url}/batches/{batch}")
    page.get_by_label("Search id and answer").fill("window.pwned")
    page.get_by_label("Search id and answer").press("Enter")  # the keyboard alone
    expect(page.get_by_role("heading", name="Items 1\u20131 of 1 matching")).to_be_visible()
    expect(page.locator("table.items tbody")).to_contain_text("<script>window.pwned = 1</script>")
    page.get_by_role("link", name="item-007").click()
    call = page.get_by_role("article", name="Tool call read_file")
    expect(call).to_contain_text(XSS)
    expect(page.get_by_role("region", name="Answer")).to_contain_text(XSS)
    assert page.locator("main img, main script").count() == 0
    assert page.evaluate("typeof window.pwned") == "undefined"


def test_the_pages_fit_a_narrow_window(page: Page, server: Replica, batch: str) -> None:
    from playwright.sync_api import expect

    page.set_viewport_size({"width": 380, "height": 800})
    sign_in(page, f"{server.url}/batches/{batch}")
    expect(page.get_by_role("heading", name=f"Items 1\u201350 of {ITEMS}")).to_be_visible()
    # Wide tables scroll inside their own box; the page itself never does sideways.
    assert page.evaluate("document.documentElement.scrollWidth <= window.innerWidth")


def test_toolq_view_opens_a_results_file(
    page: Page, tmp_path: Path, screenshots: Screenshots
) -> None:
    from playwright.sync_api import expect

    results = tmp_path / "results.jsonl"
    write_results(results, 2000)
    proc = subprocess.Popen(
        [TOOLQ, "view", str(results), "--no-browser"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        url = read_line(proc, "toolq view to print its address").split(" at ", 1)[1].split()[0]
        page.goto(url)
        expect(page.get_by_role("heading", name="Sign in")).to_be_hidden()
        expect(page.locator("table.items tbody tr")).to_have_count(50)
        tool_errors = page.get_by_role("columnheader", name="Tool errors")
        # Each click loads a page: the second is on the page the first brought (most first).
        tool_errors.get_by_role("link").click()
        expect(tool_errors).to_have_attribute("aria-sort", "ascending")
        tool_errors.get_by_role("link").click()
        expect(tool_errors).to_have_attribute("aria-sort", "descending")
        expect(page.locator("table.items tbody tr").first.locator("td.bad")).to_have_text("1")
        screenshots.take(page, "view")
    finally:
        proc.terminate()
        proc.wait(timeout=20)
