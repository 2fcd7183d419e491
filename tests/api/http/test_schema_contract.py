"""The API keeps its own contract: schemathesis, every check and the stateful phase included,
finds nothing against a real `toolq serve` on real workers.

Bounded: a fixed number of examples per operation and a fixed seed, so a failure can be replayed
(the output says how) and the run stays well under a minute. Schemathesis' warnings (say, an
operation that only ever answered 404) are not failures of the contract; its failures and
errors are. The model has no scripts: it answers every model at once, so runs and batches end
quickly, and streams of their events do.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.api.http.conftest import TOKEN
from tests.api.http.serving import Replica

pytestmark = pytest.mark.integration

SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
EXAMPLES_PER_OPERATION = 25
SEED = 17


@pytest.mark.timeout(300)
def test_schemathesis_finds_nothing(server: Replica, tmp_path: Path) -> None:
    done = subprocess.run(
        [
            SCHEMATHESIS,
            "run",
            f"{server.url}/openapi.json",
            "--header",
            f"Authorization: Bearer {TOKEN}",
            "--checks",
            "all",
            "--phases",
            "examples,coverage,fuzzing,stateful",
            "--max-examples",
            str(EXAMPLES_PER_OPERATION),
            "--seed",
            str(SEED),
            # A run's event stream lasts as long as the run: on a busy machine, many seconds.
            "--request-timeout",
            "60",
            "--no-color",
            "--report",
            "junit",
            "--report-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
        cwd=tmp_path,
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{output[-12000:]}\n--- toolq serve:\n{server.log()}"
    assert "✅ Stateful" in output, output[-6000:]  # run, not skipped
    assert not re.search(r"\d+ (failure|error)s? ", output), output[-6000:]
