"""The settings check every toolq process makes before it starts: unknown TOOLQ_ variables,
URLs toolq cannot use, values of the wrong type, each named in one line."""

from __future__ import annotations

import os

import pytest
from pydantic import ValidationError

from api.settings import OrchestratorSettings
from worker.contract.errors import SettingsError
from worker.contract.settings import (
    ORCHESTRATOR_ONLY_FIELDS,
    OTHER_VARIABLES,
    FleetSettings,
    WorkerSettings,
)
from worker.contract.settings_check import (
    checked_worker_settings,
    known_variables,
    unknown_variables,
    validation_problems,
)
from worker.sandbox.config import MARKER_VARIABLE

KNOWN = known_variables([WorkerSettings, OrchestratorSettings])


@pytest.fixture(autouse=True)
def _no_toolq_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test sets the variables it is about, and only those."""
    for name in [name for name in os.environ if name.upper().startswith("TOOLQ_")]:
        monkeypatch.delenv(name)
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)


def test_the_worker_knows_the_orchestrator_settings_it_is_started_with() -> None:
    orchestrator_only = set(OrchestratorSettings.model_fields) - set(FleetSettings.model_fields)
    assert set(ORCHESTRATOR_ONLY_FIELDS) == orchestrator_only
    assert known_variables([WorkerSettings], ORCHESTRATOR_ONLY_FIELDS) == KNOWN


def test_the_variables_toolq_sets_or_reads_besides_settings_are_known() -> None:
    assert MARKER_VARIABLE in OTHER_VARIABLES
    assert {"TOOLQ_DEBUG", MARKER_VARIABLE} <= KNOWN


@pytest.mark.parametrize(
    ("name", "line"),
    [
        (
            "TOOLQ_BROKR_URL",
            "TOOLQ_BROKR_URL is not a toolq setting; did you mean TOOLQ_BROKER_URL?",
        ),
        ("toolq_modle", "toolq_modle is not a toolq setting; did you mean TOOLQ_MODEL?"),
        (
            "TOOLQ_WORKSPACE_ROTO",
            "TOOLQ_WORKSPACE_ROTO is not a toolq setting; did you mean TOOLQ_WORKSPACE_ROOT?",
        ),
        (
            "TOOLQ_XYZZY",
            "TOOLQ_XYZZY is not a toolq setting; the settings are in docs/reference/settings.md",
        ),
    ],
)
def test_an_unknown_variable_is_named_with_the_closest_setting(name: str, line: str) -> None:
    environ = {name: "1", "TOOLQ_BROKER_URL": "redis://x", "PATH": "/bin", "OTHER_TOOLQ_X": "1"}

    assert unknown_variables(environ, KNOWN) == [line]


def test_a_misspelt_variable_stops_a_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TOOLQ_CONCURENCY", "4")

    with pytest.raises(SettingsError) as refused:
        checked_worker_settings()

    assert refused.value.problems == [
        "TOOLQ_CONCURENCY is not a toolq setting; did you mean TOOLQ_CONCURRENCY?"
    ]


def test_a_worker_takes_the_orchestrators_settings_as_known(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TOOLQ_MODEL", "some-model")
    monkeypatch.setenv("TOOLQ_API_TOKEN", "secret")
    monkeypatch.setenv("TOOLQ_DEBUG", "1")

    assert isinstance(checked_worker_settings(), WorkerSettings)


@pytest.mark.parametrize(
    ("values", "problem"),
    [
        (
            {"broker_url": "http://broker:80/0"},
            "not a broker URL toolq can use (it starts http://); use redis://, rediss://, "
            "amqp:// or amqps://",
        ),
        (
            {"broker_url": "127.0.0.1:6379"},
            "not a broker URL toolq can use (it has no scheme); use redis://, rediss://, "
            "amqp:// or amqps://",
        ),
        (
            {"broker_url": "redis://x/0", "result_backend": "amqp://guest:secret@x//"},
            "not a result store URL toolq can use (it starts amqp://); use redis:// or rediss://",
        ),
        (
            {"broker_url": "amqp://guest:secret@rabbit//"},
            "TOOLQ_RESULT_BACKEND must be a redis:// or rediss:// URL when the broker is not "
            "Redis (TOOLQ_BROKER_URL starts amqp://)",
        ),
    ],
)
def test_a_url_toolq_cannot_use_names_the_schemes_it_takes(
    values: dict[str, str], problem: str
) -> None:
    with pytest.raises(ValidationError) as refused:
        FleetSettings(**values)  # type: ignore[arg-type]

    (line,) = validation_problems(refused.value)
    assert line.endswith(problem)
    assert "secret" not in line


@pytest.mark.parametrize(
    "values",
    [
        {"broker_url": "redis://h:6379/0"},
        {"broker_url": "rediss://:pw@h:6380/0"},
        {"broker_url": "amqp://u:p@h:5672//", "result_backend": "redis://h/1"},
        {"broker_url": "amqps://u:p@h//", "result_backend": "rediss://h/1"},
        {"broker_url": "REDIS://h/0"},
    ],
)
def test_the_brokers_toolq_works_with_are_taken(values: dict[str, str]) -> None:
    assert FleetSettings(**values).redis_url.lower().startswith("redis")  # type: ignore[arg-type]


def test_an_empty_broker_url_is_unset() -> None:
    assert FleetSettings(broker_url="").local_mode
