"""``make test`` across processes keeps a module's shared stack on one of them: the tests of a
module-scoped fixture, run with pytest-xdist as the Makefile runs them, all run in one process
(a split group starts the stack twice and lets two of them take each other's messages)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
#: A module of quick tests that share a scripted model server through a module-scoped fixture.
SHARED = "tests/api/scripted/test_server.py"
#: pytest as the Makefile runs it on two processes, over the module's tests that share its
#: fixture (those with a file of their own, or a command, left out).
PYTEST = ("-m", "pytest", "-n", "2", "--dist", "loadgroup", "-v", "-p", "no:cacheprovider")
SELECTED = ("-k", "not mistakes and not command_line and not demo_calls", SHARED)


@pytest.mark.integration
def test_the_tests_of_a_shared_fixture_run_in_one_process() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "COV_"))}
    done = subprocess.run(
        [sys.executable, *PYTEST, *SELECTED],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    ran = re.findall(r"\[(gw\d+)\] \[ *\d+%\] PASSED (\S+)", done.stdout)
    assert len(ran) >= 10, done.stdout[-3000:]
    processes = {process for process, _ in ran}
    assert len(processes) == 1, f"the module's tests were split over {sorted(processes)}"
