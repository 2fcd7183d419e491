"""`toolq view OUTPUT.jsonl`: one results file in the viewer, with no fleet and no token."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest

from api.http.viewer.view import create_view_app
from tests.api.batch.conftest import record, write_lines
from tests.api.http.conftest import serving
from tests.bounded import read_line

TOOLQ = str(Path(sys.executable).parent / "toolq")


@pytest.fixture
def results(tmp_path: Path) -> Path:
    return write_lines(
        tmp_path / "results.jsonl",
        [record(f"q{n}", "error" if n == 2 else "ok", answer=f"<b>{n}</b>") for n in range(5)],
    )


@pytest.fixture
async def browser(results: Path) -> AsyncIterator[httpx.AsyncClient]:
    async with serving(create_view_app(results), headers={}) as client:
        yield client


async def test_the_first_page_comes_whole_in_the_shell(browser: httpx.AsyncClient) -> None:
    page = await browser.get("/")
    assert page.status_code == 200
    assert 'data-loaded="true"' in page.text and "results.jsonl" in page.text
    assert 'id="login" class="login" aria-labelledby="login-title" hidden' in page.text
    assert page.text.count('<th scope="row">') == 5
    assert "&lt;b&gt;3&lt;/b&gt;" in page.text
    assert 'href="/runs"' not in page.text and 'href="/fleet"' not in page.text


async def test_items_filters_and_the_absent_sections(browser: httpx.AsyncClient) -> None:
    failed = await browser.get("/batches/results.jsonl", params={"status": "error"})
    assert "Items 1\u20131 of 1 matching" in failed.text and ">q2</a>" in failed.text
    one = await browser.get("/ui/page/batches/results.jsonl/items/3")
    assert one.status_code == 200 and "<h1>q2 " in one.text
    assert (await browser.get("/batches/results.jsonl/items/6")).status_code == 404
    assert (await browser.get("/batches/other.jsonl")).status_code == 404
    assert (await browser.get("/runs")).status_code == 404
    assert (await browser.get("/fleet")).status_code == 404
    assert (await browser.get("/v1/runs")).status_code == 404  # no API at all


def test_toolq_view_prints_its_address_and_serves_the_file(results: Path) -> None:
    proc = subprocess.Popen(
        [TOOLQ, "view", str(results), "--no-browser"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        line = read_line(proc, "toolq view to print its address")
        assert line.startswith(f"toolq view: {results} at http://127.0.0.1:")
        url = line.split(" at ", 1)[1].split()[0]
        page = httpx.get(url, timeout=30)
        assert page.status_code == 200 and ">q4</a>" in page.text
    finally:
        proc.terminate()
        assert proc.wait(timeout=20) == 0


def test_toolq_view_says_what_is_wrong_with_a_missing_file(tmp_path: Path) -> None:
    done = subprocess.run(
        [TOOLQ, "view", str(tmp_path / "nope.jsonl"), "--no-browser"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    assert done.returncode == 2
    assert f"error: {tmp_path / 'nope.jsonl'}: no such file" in done.stderr
