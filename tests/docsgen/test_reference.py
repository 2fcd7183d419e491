"""The reference pages name everything the code has: every setting of every settings class,
every command and option of the toolq command, every route of the HTTP API. They are generated
from the code when the site is built; these tests read what the generators write, and the site
as ``make docs`` builds it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import typer

from api.cli import app
from api.settings import OrchestratorSettings
from docsgen import cli, http, pages, settings
from worker.contract.settings import FleetSettings, WorkerSettings, setting_names

REPO = Path(__file__).resolve().parents[2]


def every_option(group: typer.Typer) -> dict[str, set[str]]:
    """Each command's options as Click parses them, read from the app itself."""
    command = typer.main.get_command(group)
    found = {"toolq": {opt for p in command.params for opt in p.opts}}
    for name, sub in command.commands.items():  # type: ignore[attr-defined]
        found[f"toolq {name}"] = {
            opt
            for p in sub.params
            if not isinstance(p, typer.core.TyperArgument)
            for opt in [*p.opts, *p.secondary_opts]
        }
    return found


def test_every_setting_of_every_class_is_in_the_settings_page() -> None:
    page = pages.generated("settings")
    for cls in (FleetSettings, WorkerSettings, OrchestratorSettings):
        # A nested model's fields are variables of their own (TOOLQ_SANDBOX_MEMORY_MB).
        for name, field in setting_names(cls):
            row = next(
                (line for line in page.splitlines() if f"`TOOLQ_{name.upper()}`" in line), None
            )
            assert row is not None, f"TOOLQ_{name.upper()} ({cls.__name__}) is not documented"
            assert field.description, f"{cls.__name__}.{name} has no description to show"
            first_words = " ".join(field.description.split()[:3])
            assert first_words.replace("<", "&lt;").replace(">", "&gt;") in row


def test_each_setting_is_in_the_table_of_the_class_that_declares_it() -> None:
    rows = {s.variable for s in settings.settings_of(WorkerSettings)}
    assert "TOOLQ_WORKSPACE_ROOT" in rows
    assert "TOOLQ_BROKER_URL" not in rows  # FleetSettings' own
    assert settings.every_variable() >= {"TOOLQ_BROKER_URL", "TOOLQ_MODEL", "TOOLQ_PLUGINS"}
    # The sandbox's model is read by the names the variables always had.
    assert "TOOLQ_SANDBOX_MEMORY_MB" in rows and "TOOLQ_SANDBOX" not in rows


def test_defaults_are_shown_as_a_reader_would_set_them() -> None:
    shown = {
        s.variable: s for cls, _ in settings.SETTINGS_CLASSES for s in settings.settings_of(cls)
    }
    assert shown["TOOLQ_BROKER_URL"].default == "unset"
    assert shown["TOOLQ_DEFAULT_TIMEOUT_MS"].default == "`30000`"
    assert shown["TOOLQ_WORKSPACE_ROOT"].default == "`$TMPDIR/toolq/workspaces`"
    assert shown["TOOLQ_LOG_FORMAT"].type == "`auto`, `json` or `text`"
    assert shown["TOOLQ_PLUGINS"].default == "empty"


def test_every_command_and_option_is_in_the_cli_page() -> None:
    page = pages.generated("cli")
    for command, options in every_option(app).items():
        section = page.split(f"## `{command}`\n", 1)
        assert len(section) == 2, f"{command} is not documented"
        body = section[1].split("\n## ", 1)[0]
        for option in options:
            assert re.search(rf"`[^`]*{re.escape(option)}\b", body), f"{command} {option}"


def test_the_cli_page_gives_each_command_its_usage_and_help() -> None:
    run = next(c for c in cli.commands(app) if c.name == "toolq run")
    assert run.usage == "toolq run [OPTIONS] PROMPT"
    assert "Run one conversation" in run.help
    assert any(p.written == "PROMPT" and p.is_argument for p in run.parameters)


def test_every_route_is_in_the_http_page() -> None:
    application = http.build_app()
    page = pages.generated("http")
    found = http.routes(application)
    assert ("POST", "/v1/runs") in found and ("GET", "/openapi.json") in found
    for method, path in found:
        assert f"`{method} {path}`" in page, f"{method} {path} is not documented"


def test_every_schema_of_the_document_is_in_the_http_page() -> None:
    document = http.build_app().openapi()
    page = pages.generated("http")
    for name, schema in document["components"]["schemas"].items():
        assert f"### {name}\n" in page
        for field in schema.get("properties", {}):
            assert f"`{field}`" in page, f"{name}.{field}"


def test_a_type_of_the_http_page_names_each_kind_once_and_what_text_it_takes() -> None:
    page = pages.generated("http")
    filters = [
        row
        for row in page.splitlines()
        if row.startswith(("| `created_after` | query", "| `created_before` | query"))
    ]
    types = [row.split(" | ")[3] for row in filters]
    assert types and all(
        kind == "date-time string or date string or number or null" for kind in types
    )
    for row in page.splitlines():
        for cell_text in row.split(" | "):
            kinds = cell_text.split(" or ")
            assert len(kinds) == len(set(kinds)), row


def test_a_runs_options_are_in_the_http_page_with_what_each_does() -> None:
    page = pages.generated("http")
    options = page[page.index("### AgentOptions") :].split("\n### ", 1)[0]
    for field in ("image", "user", "env", "recreate", "system_prompt", "session_context_file_path"):
        row = next(line for line in options.splitlines() if line.startswith(f"| `{field}`"))
        assert not row.rstrip(" |").endswith("| no"), f"{field} says nothing of what it does"


def test_an_unknown_generated_part_stops_the_build() -> None:
    with pytest.raises(ValueError, match="no generated part named 'nope'"):
        pages.fill("<!-- generated: nope -->\n")


@pytest.mark.timeout(300)
def test_the_site_builds_strict_with_the_reference_in_it(tmp_path: Path) -> None:
    """What ``make docs`` does, into a folder of the test's."""
    site = tmp_path / "site"
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=REPO,
        env=os.environ | {"NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"},
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert built.returncode == 0, built.stderr[-4000:]
    settings_page = (site / "reference" / "settings" / "index.html").read_text()
    assert all(variable in settings_page for variable in settings.every_variable())
    cli_page = (site / "reference" / "cli" / "index.html").read_text()
    assert "toolq batch [OPTIONS] INPUT_PATH" in cli_page
    http_page = (site / "reference" / "http-api" / "index.html").read_text()
    assert "/v1/runs/{run_id}/events" in http_page
    python_page = (site / "reference" / "python" / "index.html").read_text()
    assert "stream_chat" in python_page
    assert (site / "latency.png").exists()
    assert "<!-- generated:" not in (site / "benchmarks" / "index.html").read_text()
