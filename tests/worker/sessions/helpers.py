"""What the session tests share: a call of bash_session read as the model reads it, the run's
sessions as its worker keeps them, and processes found by a token in their command line."""

from __future__ import annotations

import json
import secrets
import socket
from pathlib import Path
from typing import Any

from tests.conftest import Caller, wait_for
from worker.contract.settings import WorkerSettings
from worker.contract.wire import ToolCallResult
from worker.sandbox import SandboxConfig
from worker.sessions.holders import RunSessions

#: A call's own wait: well under the test fleet's largest deadline.
WAIT_MS = 8_000


async def session(
    call: Caller, action: str, text: str | None = None, **extra: Any
) -> dict[str, Any]:
    """A bash_session call's answer, which must not be an error."""
    return answer_of(await session_result(call, action, text, **extra))


def answer_of(result: ToolCallResult) -> dict[str, Any]:
    """A bash_session answer, read as the model reads it; it must not be an error."""
    assert not result.is_error, result.output
    answer: dict[str, Any] = json.loads(result.output)
    return answer


async def session_result(
    call: Caller, action: str, text: str | None = None, **extra: Any
) -> ToolCallResult:
    arguments: dict[str, Any] = {"action": action, "timeout": WAIT_MS, **extra}
    if text is not None:
        arguments["input"] = text
    return await call("bash_session", arguments)


def run_sessions(settings: WorkerSettings, run_id: str) -> RunSessions:
    """The sessions of run ``run_id`` as its workers keep them on this host."""
    return RunSessions(SandboxConfig.from_settings(settings), settings.workspace_root / run_id, 1)


def holder_pids(settings: WorkerSettings, run_id: str) -> list[int]:
    sessions = run_sessions(settings, run_id)
    pids = []
    for path in sessions.folder.glob("*.json"):
        record = json.loads(path.read_text())
        if record.get("holder_pid"):
            pids.append(int(record["holder_pid"]))
    return pids


def wait_for_sleep(mark: str) -> None:
    """Until ``sleep {mark}`` runs: the prompt may come back before a background job's shell
    has become sleep."""
    wait_for(lambda: bool(processes_with(f"sleep {mark}")), 30, f"sleep {mark} to start")


def token() -> str:
    """A unique number for ``sleep`` (GNU sleep adds its arguments): it marks its process."""
    return f"{secrets.randbelow(10**6) + 1000}.{secrets.randbelow(10**6):06d}"


def processes_with(marker: str) -> list[int]:
    """Live processes (not zombies) whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            state = (entry / "stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in argv and state != b"Z":
            found.append(int(entry.name))
    return found


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
    except OSError:
        return False
    return state != b"Z"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def mounts_naming(text: str) -> list[str]:
    with open("/proc/self/mountinfo") as mounts:
        return [line for line in mounts if text in line]
