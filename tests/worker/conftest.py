"""Sandbox fixtures shared by the sandbox's tests and run_bash's: each isolation mode this
machine gives, and a folder the sandbox user may work in."""

from __future__ import annotations

import os
import pwd
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.sandbox import SandboxConfig, SandboxError, describe_isolation

#: The user commands run as when the tests run as root (SandboxConfig's default).
NOBODY = pwd.getpwnam("nobody")


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
