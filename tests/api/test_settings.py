"""What every toolq command checks before it starts: its own and its workers' settings, and
the model API's URL."""

from __future__ import annotations

import os

import pytest

from api.settings import check_settings, model_url_problem
from worker.contract.errors import SettingsError
from worker.contract.settings_check import exit_on_bad_settings


@pytest.fixture(autouse=True)
def _no_toolq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it is about, and only those."""
    for name in [name for name in os.environ if name.upper().startswith("TOOLQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("http://localhost:11434/v1", None),
        ("https://api.openai.com/v1", None),
        (
            "not-a-url",
            "OPENAI_BASE_URL must be an http:// or https:// URL such as "
            "http://localhost:11434/v1 (it is 'not-a-url')",
        ),
        (
            "ftp://models/v1",
            "OPENAI_BASE_URL must be an http:// or https:// URL such as "
            "http://localhost:11434/v1 (it starts ftp://)",
        ),
        (
            "localhost:11434/v1",
            "OPENAI_BASE_URL must be an http:// or https:// URL such as "
            "http://localhost:11434/v1 (it is 'localhost:11434/v1')",
        ),
        (
            "user:secret@host/v1",
            "OPENAI_BASE_URL must be an http:// or https:// URL such as "
            "http://localhost:11434/v1 (it is not one)",
        ),
    ],
)
def test_a_model_url_must_be_http(url: str, problem: str | None) -> None:
    assert model_url_problem(url) == problem


def test_every_problem_is_a_line_of_its_own(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLQ_BROKR_URL", "redis://x/0")
    monkeypatch.setenv("TOOLQ_MAX_TIMEOUT_MS", "soon")
    monkeypatch.setenv("OPENAI_BASE_URL", "not-a-url")

    with pytest.raises(SettingsError) as refused:
        check_settings()

    assert refused.value.problems == [
        "TOOLQ_BROKR_URL is not a toolq setting; did you mean TOOLQ_BROKER_URL?",
        # Read by both the orchestrator's and the workers' settings, named once.
        "TOOLQ_MAX_TIMEOUT_MS: Input should be a valid integer, unable to parse string as an "
        "integer",
        "OPENAI_BASE_URL must be an http:// or https:// URL such as http://localhost:11434/v1 "
        "(it is 'not-a-url')",
    ]


def test_bad_settings_exit_2_with_a_line_each(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TOOLQ_SANDBOX_ISOLATION", "chroot")

    with pytest.raises(SystemExit) as stopped:
        exit_on_bad_settings(check_settings)

    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        "error: TOOLQ_SANDBOX_ISOLATION: Input should be 'auto', 'namespaces' or 'process'\n"
    )


def test_toolq_debug_keeps_the_exception(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLQ_SANDBOX_ISOLATION", "chroot")
    monkeypatch.setenv("TOOLQ_DEBUG", "1")

    with pytest.raises(SettingsError):
        exit_on_bad_settings(check_settings)
