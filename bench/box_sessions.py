"""Case 12's session figure: a bash_session call in a run's container beside an exec into it,
alternated on one container: ``true`` typed into the shell the container holds (its holder
asked over its socket, the prompt waited for) against ``true`` run by the runtime's ``exec``
(then its leftovers killed), as a sandbox worker runs each for a run with an image."""

from __future__ import annotations

import time
from pathlib import Path

from worker.images.box_shells import BoxPlace
from worker.images.boxes import Boxes, BoxRecord
from worker.images.calls import inside_path, run_in_box
from worker.sandbox import SandboxConfig
from worker.sessions.holders import RunSessions
from worker.sessions.wire import HolderRequest

TIMEOUT_MS = 10_000
#: The session's holder stays for the bench's calls; they end it, not the idle time.
IDLE_S = 600.0


def exec_and_session_ms(
    boxes: Boxes,
    record: BoxRecord,
    workspace: Path,
    owner: tuple[int, int],
    config: SandboxConfig,
    calls: int,
) -> tuple[list[float], list[float], float]:
    """``calls`` execs of ``true`` into the box and ``calls`` session calls typing it,
    alternated; and the session's first call, which starts its holder and shell."""
    place = BoxPlace(boxes.settings, record, inside_path(record, workspace))
    sessions = RunSessions(config, workspace, IDLE_S, None, lambda: place)
    typed = HolderRequest(action="type_submit", input="true", wait_ms=TIMEOUT_MS)

    def session_call() -> float:
        began = time.perf_counter()
        answer = sessions.ask("default", typed, cwd=workspace, identity=owner)
        took = (time.perf_counter() - began) * 1000
        if answer.exit_code != 0 or answer.running:
            raise RuntimeError(f"the bench's session call failed: {answer}")
        return took

    def exec_call() -> float:
        began = time.perf_counter()
        run_in_box(boxes, record, "true", cwd=workspace, env={}, timeout_ms=TIMEOUT_MS,
                   config=config)  # fmt: skip
        return (time.perf_counter() - began) * 1000

    execs: list[float] = []
    typed_ms: list[float] = []
    try:
        first = session_call()
        for _ in range(calls):
            execs.append(exec_call())
            typed_ms.append(session_call())
    finally:
        sessions.end_all()
    return execs, typed_ms, first
