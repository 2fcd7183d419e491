"""With no broker configured, an eval in the toolq sandbox starts a local stack (a private Redis
and a worker per pool), as ``toolq run`` does, and stops it when the eval ends."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.tool import bash

from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, run_eval, tool_messages
from tests.api.inspect_sandbox.evals import workers_that_ran as workers_of
from worker.contract.settings import get_worker_settings

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]


@pytest.fixture
def no_broker(monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """No TOOLQ_* variable but the local workers' workspace root, a folder of the test's own."""
    for name in [name for name in os.environ if name.startswith("TOOLQ_")]:
        monkeypatch.delenv(name)
    root = Path(tempfile.mkdtemp(prefix="toolq-inspect-local-"))
    os.chmod(root, 0o755)
    monkeypatch.setenv("TOOLQ_WORKSPACE_ROOT", str(root))
    get_worker_settings.cache_clear()  # the local stack's workers take this process's settings
    yield root
    get_worker_settings.cache_clear()
    shutil.rmtree(root, ignore_errors=True)


def test_an_eval_without_a_broker_runs_on_a_local_stack_it_then_stops(
    no_broker: Path, tmp_path: Path
) -> None:
    scripts = {"where": [("bash", {"command": "pwd"})]}
    log = run_eval([Sample(input="where", target="")], tmp_path, [bash(timeout=10)], scripts)
    assert log.samples is not None
    [sample] = log.samples
    [where] = tool_messages(sample)
    assert where.error is None
    assert where.text.strip().startswith(f"{no_broker.resolve()}/inspect-")
    pids = {int(worker.rsplit(":", 1)[1]) for worker in workers_of(sample)}
    assert pids
    for pid in pids:
        with pytest.raises(ProcessLookupError):  # the stack's workers are gone with the eval
            os.kill(pid, 0)
