"""``make bench``'s quick run, once for every test of the harness that reads its results."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO

#: The longest the quick run may take; the tests that read it allow it and a minute more.
QUICK_RUN_TIMEOUT_S = 420


@pytest.fixture(scope="package")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder ``python -m bench.run --quick`` wrote its results to: every case at tiny
    sizes, under three minutes on a quiet 2-core machine (more beside other work)."""
    out = tmp_path_factory.mktemp("bench")
    done = subprocess.run(
        [sys.executable, "-m", "bench.run", "--quick", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=QUICK_RUN_TIMEOUT_S,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    return out
