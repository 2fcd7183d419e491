"""bash_session in process, in each isolation mode this machine gives: the shell keeps its
state, Ctrl-C reaches its foreground command, and ending the run's sessions leaves no process
and no file of them; what a session lost with its worker leaves is swept once its run is over."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from tests.conftest import wait_for
from tests.worker.conftest import config_for
from tests.worker.sessions.helpers import processes_with, token
from worker.sessions.holders import sweep_sessions
from worker.sessions.records import SessionRecord
from worker.tools.bash_session import BashSessionArgs, BashSessionTool
from worker.tools.workspace import Workspace


def call(tool: BashSessionTool, **arguments: Any) -> dict[str, Any]:
    validated = BashSessionArgs.model_validate({"timeout": 8000, **arguments}).model_dump()
    answer: dict[str, Any] = json.loads(tool.execute(validated))
    return answer


def test_a_session_keeps_its_shell_and_ends_whole_in_each_mode(
    sandbox_dir: Path, mode: str
) -> None:
    tool = BashSessionTool(Workspace(sandbox_dir), config_for(mode), idle_s=60)
    mark = token()
    try:
        call(tool, action="type_submit", input=f"export X=1; sleep {mark} &")
        assert call(tool, action="type_submit", input="echo $X")["output"] == "1\n"
        still = call(tool, action="type_submit", input=f"sleep {mark}1", timeout=300)
        assert still["running"] is True
        assert call(tool, action="interrupt")["exit_code"] == 130
        assert processes_with(f"sleep {mark}")
    finally:
        assert tool.sessions().end_all() == 1
    wait_for(lambda: not processes_with(f"sleep {mark}"), 10, "the session's job to end")
    assert not tool.sessions().folder.exists()


def test_a_lost_sessions_files_are_swept_once_its_run_is_over(sandbox_dir: Path) -> None:
    workspace = sandbox_dir / "run"
    workspace.mkdir()
    config = config_for("process")
    tool = BashSessionTool(Workspace(workspace), config, idle_s=60)
    sessions = tool.sessions()
    sessions.folder.mkdir(mode=0o700, parents=True)
    # As a holder lost with its worker leaves it: a record, no holder.
    lost = sessions.folder / "0123456789abcdef.json"
    SessionRecord.new("default", 1, str(workspace)).write(lost)

    sweep_sessions(config)
    assert lost.exists()  # its run may still ask: it hears "session lost"
    shutil.rmtree(workspace)
    assert sweep_sessions(config) >= 1

    assert not lost.exists() and not sessions.folder.exists()
