"""The toolq command as a user runs it: the installed entry point, in a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

TOOLQ = str(Path(sys.executable).parent / "toolq")


@dataclass(frozen=True)
class Ran:
    """A finished command: its exit status, what it printed, and how long it took."""

    returncode: int
    stdout: str
    stderr: str
    seconds: float


def toolq(*args: str, env: dict[str, str], timeout: float = 120) -> Ran:
    return run_command([TOOLQ, *args], env=env, timeout=timeout)


def run_command(argv: list[str], *, env: dict[str, str], timeout: float = 120) -> Ran:
    started = time.monotonic()
    done = subprocess.run(
        argv, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    return Ran(done.returncode, done.stdout, done.stderr, time.monotonic() - started)


def clean_env() -> dict[str, str]:
    """The user's environment without any toolq or OpenAI configuration."""
    return {k: v for k, v in os.environ.items() if not k.startswith(("TOOLQ_", "OPENAI_"))} | {
        "COLUMNS": "200"
    }
