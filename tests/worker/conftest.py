"""What the worker's tests share: tool call requests as the queue delivers them and the answers
sent back, each sandbox isolation mode this machine gives, a folder the sandbox user may use."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from worker.contract.wire import ToolCallResult
from worker.sandbox import SandboxConfig, SandboxError, describe_isolation

#: The built-in tools, in the order a worker registers and publishes them.
BUILT_INS = [
    "read_file",
    "write_file",
    "save_session_context",
    "list_dir",
    "mkdir",
    "remove",
    "move",
    "search_text",
    "search_files",
    "run_bash",
]
#: The caller's inbox in requests made by ``request``.
REPLY = "toolq:reply:test"

#: The user commands run as when the tests run as root (SandboxConfig's default).
NOBODY = pwd.getpwnam("nobody")


def request(tool: str, arguments: dict[str, Any] | str, **extra: Any) -> dict[str, Any]:
    """A call of ``tool`` in run ``run-1`` as the queue delivers it; ``extra`` overrides."""
    body: dict[str, Any] = {
        "task_id": extra.pop("task_id", f"id-{tool}-{time.monotonic_ns()}"),
        "run_id": "run-1",
        "tool": tool,
        "arguments": arguments,
        "timeout_ms": 5000,
        "deadline": time.time() + 60,
        "reply_to": REPLY,
    }
    body.update(extra)
    return body


def replies(client: fakeredis.FakeRedis) -> list[ToolCallResult]:
    """The answers sent to ``REPLY``, oldest first."""
    return [ToolCallResult.model_validate_json(r) for r in client.lrange(REPLY, 0, -1)]


def config_for(mode: str, **options: object) -> SandboxConfig:
    """A sandbox configuration for the isolation ``mode`` a test was given."""
    return SandboxConfig(isolation=mode, **options)  # type: ignore[arg-type]


def sleeps(tag: str) -> list[int]:
    """``sleep`` processes with ``tag`` in an argument (wrappers and shells excluded)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                argv = (entry / "cmdline").read_bytes().split(b"\0")
            except OSError:
                continue
            if Path(argv[0].decode(errors="replace")).name == "sleep" and any(
                tag.encode() in arg for arg in argv[1:]
            ):
                found.append(int(entry.name))
    return found


def namespaces_unavailable() -> str | None:
    try:
        describe_isolation(SandboxConfig(isolation="namespaces"))
    except SandboxError as exc:
        return str(exc)
    return None


@pytest.fixture(params=["process", pytest.param("namespaces", marks=pytest.mark.netns)])
def mode(request: pytest.FixtureRequest) -> str:
    isolation: str = request.param
    if isolation == "namespaces" and (reason := namespaces_unavailable()):
        pytest.skip(f"this machine gives no PID/network namespaces: {reason}")
    return isolation


@pytest.fixture
def sandbox_dir() -> Iterator[Path]:
    """A folder under /tmp the sandbox user may use: theirs when we are root."""
    root = Path(tempfile.mkdtemp(prefix="toolq-sandbox-"))
    if os.geteuid() == 0:
        os.chown(root, NOBODY.pw_uid, NOBODY.pw_gid)
    yield root
    shutil.rmtree(root, ignore_errors=True)
