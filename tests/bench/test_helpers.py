"""The small helpers the cases share: a batch's items file, and a command run to its end."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from bench.conversations import write_prompts
from bench.stack import run_checked


def test_the_items_are_one_prompt_a_line(tmp_path: Path) -> None:
    items = write_prompts(tmp_path / "items.jsonl", 3, "s")
    lines = [json.loads(line) for line in items.read_text().splitlines()]
    assert lines == [{"id": f"s{n}", "prompt": "go"} for n in range(3)]


def test_a_command_that_succeeds_gives_its_output(tmp_path: Path) -> None:
    done = run_checked(
        [sys.executable, "-c", "import os; print(os.getcwd())"],
        dict(os.environ),
        "printing",
        timeout=60,
        cwd=str(tmp_path),
    )
    assert done.stdout.strip() == str(tmp_path)


def test_a_command_that_fails_says_what_and_why() -> None:
    failing = [sys.executable, "-c", "import sys; sys.exit('the reason')"]
    with pytest.raises(RuntimeError, match="the step failed:\nthe reason"):
        run_checked(failing, dict(os.environ), "the step", timeout=60)
