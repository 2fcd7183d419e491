"""The API keeps its own contract: schemathesis, every check and the stateful phase included,
finds nothing against a real `toolq serve` on real workers.

Bounded: a fixed number of examples per operation and a fixed seed, so a failure can be replayed
(the output says how) and the run stays well under a minute. Schemathesis' warnings (say, an
operation that only ever answered 404) are not failures of the contract; its failures and
errors are.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.scripted.server import ScriptedServer
from tests.api.http.conftest import scripted_model
from tests.api.http.serving import Replica, serve_environment
from tests.conftest import WorkerFleet

pytestmark = pytest.mark.integration

TOKEN = "contract-token"
SCHEMATHESIS = str(Path(sys.executable).parent / "schemathesis")
EXAMPLES_PER_OPERATION = 25
SEED = 17


@pytest.fixture(scope="module")
def server(fleet: WorkerFleet, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    # Every model answers at once: runs and batches end quickly, so streams of their events do.
    model: ScriptedServer
    with scripted_model({}, tmp_path_factory.mktemp("contract-scripts")) as model:
        replica = Replica(
            serve_environment(fleet, model, TOKEN),
            tmp_path_factory.mktemp("contract"),
            "serve",
            TOKEN,
        )
        try:
            yield replica.start()
        finally:
            replica.stop()
            replica.client.close()


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
