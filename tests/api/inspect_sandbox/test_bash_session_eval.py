"""Inspect's own bash_session() on ``sandbox="toolq"``, as on its docker sandbox: a scripted
model (mockllm) drives one shell across turns, whose folder, variables and background server
stay from one call to the next."""

from __future__ import annotations

from pathlib import Path

import pytest
from inspect_ai.dataset import Sample
from inspect_ai.tool import bash_session

from tests.api.inspect_sandbox.evals import INSPECT_WARNINGS, Scripts, run_eval, tool_messages
from tests.conftest import WorkerFleet
from tests.worker.sessions.helpers import free_port

pytestmark = [pytest.mark.integration, INSPECT_WARNINGS]


def scripts(port: int) -> Scripts:
    return {
        "session": [
            (
                "bash_session",
                {"action": "type_submit", "input": "mkdir -p sub && cd sub && export X=1"},
            ),
            ("bash_session", {"action": "type_submit", "input": "pwd; echo X=$X"}),
            (
                "bash_session",
                {
                    "action": "type_submit",
                    "input": f"python3 -m http.server {port} >/dev/null 2>&1 &",
                },
            ),
            (
                "bash_session",
                {
                    "action": "type_submit",
                    "input": f"for i in $(seq 50); do curl -s localhost:{port} >/dev/null && "
                    f"break; sleep 0.1; done; curl -s localhost:{port} | grep -c DOCTYPE; "
                    "echo $X > ../answer.txt",
                },
            ),
        ]
    }


def test_inspects_bash_session_keeps_its_shell_across_turns(
    fleet_env: WorkerFleet, tmp_path: Path
) -> None:
    log = run_eval(
        [Sample(input="session", target="1")],
        tmp_path / "logs",
        [bash_session()],
        scripts(free_port()),
    )

    [sample] = log.samples or []
    outputs = [str(message.content) for message in tool_messages(sample)]
    assert all(message.error is None for message in tool_messages(sample)), outputs
    assert "/sub" in outputs[1] and "X=1" in outputs[1], outputs
    assert "1" in outputs[3], outputs
    assert sample.scores and sample.scores["answer_file"].answer == "1"
