"""Errors a user can cause in the first hour, each said in one line with the same exit status
in every command: 2 for what the user typed or set (a port out of range, a port in use, a URL
that cannot be one), 1 for a fleet that cannot be reached.
"""

from __future__ import annotations

import json
import os
import pty
import re
import select
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.local.stack import free_port
from tests.conftest import WorkerFleet
from tests.e2e.commands import TOOLQ, clean_env, toolq
from tests.e2e.test_first_hour import AtOnce, at_once, told

pytestmark = pytest.mark.e2e

__all__ = ["at_once"]  # the fixture, shared with the first hour's tests

#: Each command that listens, with what it needs besides --port.
SERVERS = {
    "serve": ["serve"],
    "view": ["view", "--no-browser", "results.jsonl"],
    "scripted-llm": ["scripted-llm"],
}


#: The columns of toolq status's table of sandbox workers' limits; isolation is the last.
LIMITS_COLUMNS = 7


@pytest.fixture
def in_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder holding a batch's results file, the commands' working directory."""
    (tmp_path / "results.jsonl").write_text('{"id": "a", "status": "ok"}\n')
    monkeypatch.chdir(tmp_path)
    return tmp_path


def server_env() -> dict[str, str]:
    return clean_env() | {"OPENAI_API_KEY": "test"}


@pytest.mark.parametrize("url", ["redis://127.0.0.1:99999/0", "amqp://u:secret@h:x//"])
def test_a_broker_url_whose_port_is_no_port_is_a_setting_named(url: str, at_once: AtOnce) -> None:
    env = clean_env() | {"TOOLQ_BROKER_URL": url, "TOOLQ_RESULT_BACKEND": "redis://h:1/0"}

    ran = toolq("status", env=env)

    port = url.rpartition(":")[2].split("/")[0]
    told(
        ran,
        2,
        f"error: TOOLQ_BROKER_URL: not a broker URL toolq can use (its port '{port}' is not a "
        "number from 0 to 65535)",
    )
    assert "secret" not in ran.stderr
    at_once(ran)


def test_a_result_store_url_whose_port_is_no_port_is_named() -> None:
    env = clean_env() | {"TOOLQ_RESULT_BACKEND": "redis://127.0.0.1:70000/0"}

    ran = toolq("tools", env=env)

    told(
        ran,
        2,
        "error: TOOLQ_RESULT_BACKEND: not a result store URL toolq can use (its port '70000' is "
        "not a number from 0 to 65535)",
    )


@pytest.mark.parametrize("command", SERVERS)
@pytest.mark.parametrize("port", ["99999", "-1"])
def test_a_port_out_of_range_is_one_line_and_exit_2(
    command: str, port: str, in_folder: Path, at_once: AtOnce
) -> None:
    ran = toolq(*SERVERS[command], "--port", port, env=server_env())

    bound = "less than or equal to 65535" if port == "99999" else "greater than or equal to 0"
    told(
        ran,
        2,
        f"error: Invalid value for '--port': Input should be {bound} (toolq {command} -h shows "
        "its options)",
    )
    at_once(ran)


@pytest.mark.parametrize("command", SERVERS)
def test_a_port_in_use_is_the_same_line_and_exit_2_in_every_server(
    command: str, in_folder: Path, at_once: AtOnce
) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ran = toolq(*SERVERS[command], "--port", str(port), env=server_env())

    told(
        ran,
        2,
        f"error: cannot listen on 127.0.0.1:{port}: address already in use; choose another "
        "--port, or stop what listens there",
    )
    assert ran.stdout == ""  # no server's start-up lines either
    at_once(ran)


def test_a_worker_on_a_broker_that_is_down_is_one_line_before_celery_starts(
    at_once: AtOnce,
) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"

    ran = toolq("worker", "--pool", "tools", env=clean_env() | {"TOOLQ_BROKER_URL": url})

    told(
        ran,
        1,
        f"error: cannot connect to the broker at {url} (TOOLQ_BROKER_URL): connection refused; "
        "check that it is running and listens on that host and port",
    )
    assert ran.stdout == ""  # no banner
    at_once(ran)


def test_a_worker_with_no_broker_set_checks_the_default_one() -> None:
    """Unset, a worker's broker is redis://127.0.0.1:6379/0: one that is not there is said."""
    if _answers(6379):
        pytest.skip("a Redis listens on 6379 here")

    ran = toolq("worker", env=clean_env())

    told(
        ran,
        1,
        "error: cannot connect to the broker at redis://127.0.0.1:6379/0 (TOOLQ_BROKER_URL): "
        "connection refused; check that it is running and listens on that host and port",
    )


def _answers(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.fixture
def terminal_of_80_columns() -> Iterator[tuple[int, int]]:
    """A pseudo-terminal 80 columns wide (its reading end, its terminal): rich fits its tables
    to a terminal's width."""
    reading, terminal = pty.openpty()
    yield reading, terminal
    os.close(reading)
    os.close(terminal)


def test_status_on_an_80_column_terminal_cuts_no_isolation_layer(
    fleet: WorkerFleet, terminal_of_80_columns: tuple[int, int]
) -> None:
    reading, terminal = terminal_of_80_columns
    env = clean_env() | {"TOOLQ_BROKER_URL": fleet.settings.broker_url or "", "COLUMNS": "80"}
    document = toolq("status", "--json", env=env)
    assert document.returncode == 0, document.stderr
    layers = [
        layer
        for worker in json.loads(document.stdout)["sandbox_workers"]
        for layer in worker["limits"]["sandbox"]["isolation"]
    ]
    assert layers

    shown = subprocess.run(
        [TOOLQ, "status"], env=env, stdout=terminal, stderr=subprocess.PIPE, timeout=120
    )
    printed = _written(reading)

    assert shown.returncode == 0, shown.stderr
    assert max(len(line) for line in printed.splitlines()) <= 80
    assert "…" not in printed
    # The limits table's last column, line by line: a folded cell goes on in the next line.
    rows = [
        line.split("│") for line in printed.splitlines() if line.count("│") == LIMITS_COLUMNS + 1
    ]
    isolation = "".join(re.sub(r"\s", "", row[-2]) for row in rows)
    for layer in layers:
        assert re.sub(r"\s", "", layer) in isolation, (layer, printed)


def _written(reading: int) -> str:
    """What the finished command wrote to the terminal."""
    chunks = []
    while select.select([reading], [], [], 0)[0]:
        chunk = os.read(reading, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    text = b"".join(chunks).decode().replace("\r\n", "\n")
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # colours and bold


def test_wait_is_ready_once_live_workers_serve_the_tools(fleet: WorkerFleet) -> None:
    env = clean_env() | {"TOOLQ_BROKER_URL": fleet.settings.broker_url or ""}

    ran = toolq("wait", "read_file", "run_bash", "--timeout", "30", env=env)

    assert (ran.returncode, ran.stdout, ran.stderr) == (
        0,
        "the fleet is ready: read_file, run_bash served\n",
        "",
    )


def test_wait_for_a_tool_nobody_serves_gives_up_in_one_line(fleet: WorkerFleet) -> None:
    env = clean_env() | {"TOOLQ_BROKER_URL": fleet.settings.broker_url or ""}

    ran = toolq("wait", "no_such_tool", "--timeout", "1", env=env)

    told(
        ran,
        1,
        "error: after 1 s no live worker serves no_such_tool; start one (toolq worker --pool "
        "POOL) and see what it printed",
    )


def test_wait_without_a_broker_has_nothing_to_wait_for() -> None:
    ran = toolq("wait", env=clean_env())

    told(ran, 2, "error: no broker configured (TOOLQ_BROKER_URL): there is no fleet to wait for")
