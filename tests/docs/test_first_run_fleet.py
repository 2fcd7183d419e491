"""First run's "A real fleet" block, run by a user who is not root: it ends either way, with the
sandbox worker's one line saying what to set, or served once that is set; it never waits on a
worker that has stopped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from api.local.stack import free_port
from tests.docs.blocks import REPO, blocks
from tests.docs.test_code_blocks import page_environment, run_in_session

pytestmark = pytest.mark.e2e

FIRST_RUN = REPO / "docs" / "tutorials" / "first-run.md"
#: The block's end is bounded by toolq wait's timeout (60 s) and two starts; past this it hangs.
BLOCK_TIMEOUT_S = 240
NOBODY = 65534
#: The sandbox worker's line as a user who is not root.
NOT_ROOT = (
    "error: the sandbox cannot keep runs apart: this worker is not root, so it cannot give each "
    "run a uid of its own (run it as root, or as root in a user namespace as deploy/ does); to "
    "let runs share one uid anyway, set TOOLQ_SANDBOX_SHARED=allow"
)
WORKER_STOPPED = re.compile(
    r"error: the worker of pid \d+ stopped before the fleet was ready; the error it printed says "
    r"why"
)


def fleet_block() -> str:
    """The block, on a port of its own: the docs tests' pages use 6390."""
    (block,) = [b for b in blocks(FIRST_RUN) if "toolq wait read_file run_bash" in b.code]
    return block.code.replace("6390", str(free_port()))


def as_a_user(argv: list[str]) -> list[str]:
    """``argv`` run as nobody when the tests run as root. The venv may be under /root, which
    nobody may not enter: the user keeps the right to read and search folders, nothing else of
    root's (its uid is what the sandbox worker looks at)."""
    if os.geteuid() != 0:
        return argv
    return [
        "setpriv",
        f"--reuid={NOBODY}",
        f"--regid={NOBODY}",
        "--clear-groups",
        "--inh-caps=+dac_read_search",
        "--ambient-caps=+dac_read_search",
        *argv,
    ]


def run_block(tmp_path: Path, model_url: str, *, extra: str = "") -> tuple[int, str, str]:
    home = tmp_path / "home"
    home.mkdir()
    if os.geteuid() == 0:
        os.chown(home, NOBODY, NOBODY)
    tmp_path.chmod(0o755)
    script = home / "block.sh"
    script.write_text(f"set -euo pipefail\n{extra}{fleet_block()}\n")
    env = page_environment(model_url) | {"HOME": str(home), "TMPDIR": str(home)}
    out, err = tmp_path / "stdout", tmp_path / "stderr"
    status = run_in_session(
        as_a_user(["bash", str(script)]),
        cwd=home,
        env=env,
        output=(out, err),
        timeout_s=BLOCK_TIMEOUT_S,
        what="the fleet block",
    )
    return status, out.read_text(), err.read_text(errors="replace")


def test_the_fleet_block_stops_with_what_to_set_for_a_user_who_is_not_root(
    tmp_path: Path,
) -> None:
    status, stdout, stderr = run_block(tmp_path, "http://127.0.0.1:9/v1")

    lines = stderr.splitlines()
    assert status == 1, stderr[-3000:]
    assert NOT_ROOT in lines
    assert any(WORKER_STOPPED.fullmatch(line) for line in lines), stderr[-3000:]
    assert "calls in flight" not in stdout  # toolq status did not run: the block stopped there


def test_the_fleet_block_serves_a_user_who_is_not_root_and_lets_runs_share_a_uid(
    tmp_path: Path,
) -> None:
    status, stdout, stderr = run_block(
        tmp_path, "http://127.0.0.1:9/v1", extra="export TOOLQ_SANDBOX_SHARED=allow\n"
    )

    assert status == 0, stderr[-3000:]
    assert "the fleet is ready: read_file, run_bash served" in stdout
    assert "calls in flight: 0" in stdout  # toolq status ran
