"""Case 15: a bash_session call beside a run_bash call, in one run, in process as a sandbox
worker runs them: ``true`` typed into the run's shell (its holder asked over its socket, the
shell's prompt waited for) next to ``true`` run by run_bash (a launch, its namespaces and
groups, the command, its end). The session's first call, which starts its shell, is measured
apart.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.stats import CaseResult, Comparison, summarize
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE
from worker.sandbox import SandboxConfig
from worker.tools.bash import RunBashArgs, RunBashTool
from worker.tools.bash_session import BashSessionArgs, BashSessionTool
from worker.tools.factory import prepare_workspace

TIMEOUT_MS = 10_000


def sessions_case(calls: int, warmup: int) -> CaseResult:
    """``calls`` of each tool, alternating, after ``warmup`` of each."""
    result = CaseResult(
        key="sessions", title="15. A bash_session call beside a run_bash call (same run)"
    )
    with tempfile.TemporaryDirectory(
        prefix="toolq-bench-sessions-", ignore_cleanup_errors=True
    ) as root:
        os.chmod(root, 0o711)
        sandbox = SandboxConfig(
            SandboxSettings(uid_range=DEFAULT_UID_RANGE if os.geteuid() == 0 else ""),
            workspace_root=root,
        )
        workspace = prepare_workspace(Path(root) / "bench-sessions", sandbox)
        bash = RunBashTool(workspace, sandbox)
        session = BashSessionTool(workspace, sandbox, idle_s=600)
        run_bash = _timed(bash.execute, RunBashArgs, {"command": "true"})
        typed = _timed(session.execute, BashSessionArgs, {"action": "type_submit", "input": "true"})
        try:
            first = typed()  # the shell's start
            for _ in range(warmup):
                run_bash()
                typed()
            bash_ms: list[float] = []
            session_ms: list[float] = []
            for _ in range(calls):
                bash_ms.append(run_bash())
                session_ms.append(typed())
        finally:
            session.sessions().end_all()
    result.figures["run_bash_true"] = summarize(bash_ms)
    result.figures["bash_session_true"] = summarize(session_ms)
    result.figures["bash_session_first_call_ms"] = round(first, 2)
    result.samples_ms["run_bash 'true'"] = bash_ms
    result.samples_ms["bash_session 'true'"] = session_ms
    result.comparisons.append(
        Comparison(
            metric="bash_session: 'true' typed into the run's shell (p50)",
            value=result.figures["bash_session_true"]["p50_ms"],
            baseline=result.figures["run_bash_true"]["p50_ms"],
            baseline_name="run_bash 'true' in the same run",
            unit="ms",
        )
    )
    result.notes.append(
        "In process, no queue: the pool's round trip comes on top of both (case 4). The "
        f"session's first call, which starts its holder and shell, took {first:.0f} ms."
    )
    return result


def _timed(
    execute: Callable[[dict[str, object]], str],
    args: type[RunBashArgs] | type[BashSessionArgs],
    given: dict[str, object],
) -> Callable[[], float]:
    arguments = args.model_validate({**given, "timeout": TIMEOUT_MS}).model_dump()

    def call() -> float:
        began = time.perf_counter()
        answer = json.loads(execute(arguments))
        took = (time.perf_counter() - began) * 1000
        if answer.get("exit_code") != 0:
            raise RuntimeError(f"the bench's call failed: {answer}")
        return took

    return call
