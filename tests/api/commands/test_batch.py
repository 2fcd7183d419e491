"""``toolq batch``'s own checks before anything runs, and the open-file limit it raises."""

from __future__ import annotations

import io
import resource
from collections.abc import Callable
from pathlib import Path

import pytest
from rich.console import Console

from api.commands import batch as batch_cli
from tests.api.batch.conftest import record, write_lines


def command_output(run: Callable[[Console], int]) -> tuple[int, str]:
    console = Console(record=True, width=200, file=io.StringIO())
    code = run(console)
    return code, console.export_text()


def test_a_missing_input_file_is_a_usage_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_cli, "configure_logging", lambda settings: None)
    code, text = command_output(
        lambda err: batch_cli.run_batch_command(
            tmp_path / "missing.jsonl", tmp_path / "out.jsonl", concurrency=4, model=None, err=err
        ),
    )
    assert code == 2
    assert "input file not found" in text
    assert "missing.jsonl" in text
    assert not (tmp_path / "out.jsonl").exists()


def test_no_model_api_is_a_usage_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(batch_cli, "configure_logging", lambda settings: None)
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    source = write_lines(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p"}])
    code, text = command_output(
        lambda err: batch_cli.run_batch_command(
            source, tmp_path / "out.jsonl", concurrency=4, model=None, err=err
        ),
    )
    assert code == 2
    assert "no model API configured" in text
    assert "OPENAI_API_KEY" in text


def test_a_batch_with_nothing_left_to_do_needs_no_fleet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(batch_cli, "configure_logging", lambda settings: None)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    source = write_lines(tmp_path / "in.jsonl", [{"id": "a", "prompt": "p"}, "oops"])
    out = write_lines(tmp_path / "out.jsonl", [record("a")])
    code, text = command_output(
        lambda err: batch_cli.run_batch_command(source, out, concurrency=4, model=None, err=err),
    )
    assert code == 1  # the bad line
    assert "in.jsonl:2: skipped: not JSON" in text
    assert "0 ok, 0 error, 1 bad lines skipped, 1 already done" in text


# --- The open-file limit -------------------------------------------------------------------------


class FakeLimits:
    def __init__(self, soft: int, hard: int) -> None:
        self.limits = (soft, hard)

    def getrlimit(self, which: int) -> tuple[int, int]:
        return self.limits

    def setrlimit(self, which: int, limits: tuple[int, int]) -> None:
        self.limits = limits


@pytest.mark.parametrize(
    ("soft", "hard", "after", "warned"),
    [
        (1024, 4096, (1256, 4096), False),
        (1024, 1100, (1100, 1100), True),
        (20000, 20000, (20000, 20000), False),
    ],
)
def test_the_open_file_limit_is_raised_for_a_large_concurrency(
    monkeypatch: pytest.MonkeyPatch, soft: int, hard: int, after: tuple[int, int], warned: bool
) -> None:
    limits = FakeLimits(soft, hard)
    monkeypatch.setattr(resource, "getrlimit", limits.getrlimit)
    monkeypatch.setattr(resource, "setrlimit", limits.setrlimit)
    console = Console(record=True, width=200, file=io.StringIO())
    batch_cli.allow_open_files(1256, console)
    assert limits.limits == after
    assert ("raise it (ulimit -n) or lower --concurrency" in console.export_text()) == warned
