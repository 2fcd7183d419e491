"""What a new user meets first, run as they run it: wrong settings, a broker that is down or
refuses the password, a model URL that is wrong, a port in use, failed tool calls, --help.

Each is an exit status and a line that says what is wrong, never a traceback, and comes about
as soon as toolq can start and stop: it starts no stack and waits on no server it need not.
"""

from __future__ import annotations

import socket
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from api.calls.fleet import read_manifest
from api.local.stack import free_port, worker_environment
from api.scripted.script import Script
from api.scripted.server import ScriptedServer
from tests.conftest import WorkerFleet
from tests.e2e.commands import Ran, clean_env, run_command, toolq
from tests.rabbitmq import require_rabbitmq, with_wrong_password
from tests.results_file import finished_records
from worker.contract.wire import ToolSpec

pytestmark = pytest.mark.e2e

#: A command that stops at once takes at most this many times what ``toolq --help`` takes on the
#: same machine under the same load (the heaviest, `toolq serve`, which imports the HTTP stack
#: first, up to about six on a busy machine); a local stack, or retries of a server that is
#: down, take tens of seconds.
AT_ONCE_RATIO = 10.0
#: A broker that never answers is given up on after this wait.
NO_ANSWER_WAIT_S = 3.0
REFUSED_TOOLS = "check that it is running and listens on that host and port"

#: Every command, with arguments it would run with.
COMMANDS = {
    "run": ["run", "hello"],
    "batch": ["batch", "in.jsonl", "-o", "out.jsonl"],
    "serve": ["serve", "--port", "1"],
    "tools": ["tools"],
    "status": ["status"],
    "demo": ["demo"],
    "worker": ["worker", "--pool", "tools"],
    "scripted-llm": ["scripted-llm", "--port", "1"],
}


#: ``at_once(ran, waits_s=0.0)``: fails unless ``ran`` ended about as soon as toolq can start
#: and stop, after the ``waits_s`` it is meant to wait.
AtOnce = Callable[..., None]


@pytest.fixture(scope="module")
def at_once() -> AtOnce:
    """Compares a command's time with toolq's start-up on this machine, measured by a run of
    ``toolq --help``: once, and again when a comparison fails, as the machine may be busier now.
    A busy machine slows both alike, so no fixed number of seconds decides."""
    start_ups: list[float] = []

    def start_up_s(fresh: bool) -> float:
        if fresh or not start_ups:
            start_ups.append(toolq("--help", env=clean_env()).seconds)
        return start_ups[-1]

    def check(ran: Ran, waits_s: float = 0.0) -> None:
        for fresh in (False, True):
            if ran.seconds < waits_s + AT_ONCE_RATIO * start_up_s(fresh):
                return
        raise AssertionError(
            f"took {ran.seconds:.1f} s, while toolq starts and stops in {start_ups[-1]:.1f} s "
            f"here now (waits allowed: {waits_s:g} s)"
        )

    return check


def told(ran: Ran, status: int, *lines: str) -> None:
    """``ran`` exited with ``status`` and printed exactly ``lines`` on stderr."""
    assert "Traceback" not in ran.stderr + ran.stdout, ran.stderr
    assert ran.stderr.splitlines() == list(lines), ran.stderr
    assert ran.returncode == status, ran.stderr


# -- settings ------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", COMMANDS)
def test_a_misspelt_setting_stops_every_command_before_it_starts(
    command: str, at_once: AtOnce
) -> None:
    env = clean_env() | {"TOOLQ_BROKR_URL": "redis://127.0.0.1:6379/0"}

    ran = toolq(*COMMANDS[command], env=env)

    told(ran, 2, "error: TOOLQ_BROKR_URL is not a toolq setting; did you mean TOOLQ_BROKER_URL?")
    at_once(ran)


def test_a_misspelt_setting_stops_a_worker_started_with_celery(at_once: AtOnce) -> None:
    env = clean_env() | {"TOOLQ_DISABLED_TOOL": "run_bash"}
    argv = [sys.executable, "-m", "celery", "-A", "worker.app", "worker", "-Q", "tools"]

    ran = run_command(argv, env=env, timeout=30)

    told(
        ran,
        2,
        "error: TOOLQ_DISABLED_TOOL is not a toolq setting; did you mean TOOLQ_DISABLED_TOOLS?",
    )
    at_once(ran)


SCHEMES_REFUSED = [
    (
        {"TOOLQ_BROKER_URL": "http://127.0.0.1:6379/0"},
        "error: TOOLQ_BROKER_URL: not a broker URL toolq can use (it starts http://); use "
        "redis://, rediss://, amqp:// or amqps://",
    ),
    (
        {"TOOLQ_BROKER_URL": "redis://127.0.0.1:6379/0", "TOOLQ_RESULT_BACKEND": "amqp://r//"},
        "error: TOOLQ_RESULT_BACKEND: not a result store URL toolq can use (it starts amqp://); "
        "use redis:// or rediss://",
    ),
    (
        {"TOOLQ_BROKER_URL": "amqp://guest:guest@127.0.0.1:5672//"},
        "error: TOOLQ_RESULT_BACKEND must be a redis:// or rediss:// URL when the broker is not "
        "Redis (TOOLQ_BROKER_URL starts amqp://)",
    ),
    (
        {"OPENAI_BASE_URL": "not-a-url"},
        "error: OPENAI_BASE_URL must be an http:// or https:// URL such as "
        "http://localhost:11434/v1 (it is 'not-a-url')",
    ),
    (
        {"OPENAI_BASE_URL": "ftp://models.example/v1"},
        "error: OPENAI_BASE_URL must be an http:// or https:// URL such as "
        "http://localhost:11434/v1 (it starts ftp://)",
    ),
]


@pytest.mark.parametrize(("variables", "line"), SCHEMES_REFUSED)
def test_a_url_toolq_cannot_use_is_named_with_what_it_takes(
    variables: dict[str, str], line: str, at_once: AtOnce
) -> None:
    ran = toolq("run", "hello", env=clean_env() | {"OPENAI_API_KEY": "test"} | variables)

    told(ran, 2, line)
    at_once(ran)


def test_toolq_debug_shows_the_traceback() -> None:
    env = clean_env() | {"TOOLQ_BROKR_URL": "redis://x/0", "TOOLQ_DEBUG": "1"}

    ran = toolq("tools", env=env)

    assert ran.returncode != 0
    assert "Traceback" in ran.stderr
    assert "SettingsError: TOOLQ_BROKR_URL is not a toolq setting" in ran.stderr


# -- connections ---------------------------------------------------------------------------------


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never answers."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


@pytest.mark.parametrize("command", ["run", "tools", "status", "serve"])
def test_a_broker_that_is_down_is_one_line_and_exit_1(command: str, at_once: AtOnce) -> None:
    port = free_port()
    url = f"redis://127.0.0.1:{port}/0"
    env = clean_env() | {"TOOLQ_BROKER_URL": url, "OPENAI_API_KEY": "test"}

    ran = toolq(*COMMANDS[command][:1], *(["hi"] if command == "run" else []), env=env)

    told(
        ran,
        1,
        f"error: cannot connect to the broker at {url} (TOOLQ_BROKER_URL): connection refused; "
        f"{REFUSED_TOOLS}",
    )
    at_once(ran)


def test_a_batch_on_a_broker_that_is_down_stops_before_any_conversation(
    tmp_path: Path, at_once: AtOnce
) -> None:
    port = free_port()
    source = tmp_path / "in.jsonl"
    source.write_text('{"id": "a", "prompt": "hi"}\n')
    env = clean_env() | {"TOOLQ_BROKER_URL": f"redis://127.0.0.1:{port}/0", "OPENAI_API_KEY": "t"}

    ran = toolq("batch", str(source), "-o", str(tmp_path / "out.jsonl"), env=env)

    assert ran.returncode == 1
    assert ran.stderr.splitlines()[0] == (
        f"error: cannot connect to the broker at redis://127.0.0.1:{port}/0 (TOOLQ_BROKER_URL): "
        f"connection refused; {REFUSED_TOOLS}"
    )
    assert "Traceback" not in ran.stderr
    at_once(ran)


def test_an_unknown_broker_host_is_named(at_once: AtOnce) -> None:
    env = clean_env() | {"TOOLQ_BROKER_URL": "redis://:secret@toolq-broker.invalid:6379/0"}

    ran = toolq("tools", env=env)

    told(
        ran,
        1,
        "error: cannot connect to the broker at redis://:**@toolq-broker.invalid:6379/0 "
        "(TOOLQ_BROKER_URL): unknown host 'toolq-broker.invalid'; check the host name",
    )
    at_once(ran)


def test_a_broker_that_never_answers_is_given_up_on_in_seconds(
    silent_port: int, at_once: AtOnce
) -> None:
    url = f"redis://127.0.0.1:{silent_port}/0"

    ran = toolq("status", env=clean_env() | {"TOOLQ_BROKER_URL": url})

    told(
        ran,
        1,
        f"error: cannot connect to the broker at {url} (TOOLQ_BROKER_URL): no answer within "
        f"{NO_ANSWER_WAIT_S:g} s; check the host and port, and that no firewall drops the "
        "connection",
    )
    at_once(ran, waits_s=NO_ANSWER_WAIT_S)


@pytest.mark.integration
def test_rabbitmq_refusing_the_password_stops_a_run_at_once(
    fleet: WorkerFleet, at_once: AtOnce
) -> None:
    require_rabbitmq()
    wrong, shown = with_wrong_password()
    env = clean_env() | {
        "TOOLQ_BROKER_URL": wrong,
        "TOOLQ_RESULT_BACKEND": fleet.settings.redis_url,
        "OPENAI_BASE_URL": "http://127.0.0.1:1/v1",
        "OPENAI_API_KEY": "test",
    }

    ran = toolq("run", "hello", env=env)

    told(
        ran,
        1,
        f"error: cannot connect to the broker at {shown} "
        "(TOOLQ_BROKER_URL): login refused (403 ACCESS_REFUSED); check the user name and "
        "password in the URL",
    )
    at_once(ran)


# -- the model API -------------------------------------------------------------------------------


def fleet_env(fleet: WorkerFleet, **variables: str) -> dict[str, str]:
    return clean_env() | worker_environment(fleet.settings) | variables


def test_a_model_api_that_refuses_connections_is_reported_as_refused(fleet: WorkerFleet) -> None:
    port = free_port()
    env = fleet_env(
        fleet,
        OPENAI_BASE_URL=f"http://127.0.0.1:{port}/v1",
        OPENAI_API_KEY="test",
        TOOLQ_LLM_MAX_RETRIES="0",
    )

    ran = toolq("run", "hello", env=env)

    told(
        ran,
        1,
        "error: model request failed after 1 attempt: the connection was refused (Cannot "
        f"connect to host 127.0.0.1:{port} ssl:default [Connect call failed ('127.0.0.1', "
        f"{port})])",
    )


# -- toolq serve ---------------------------------------------------------------------------------


def test_serve_on_a_port_in_use_says_so_before_starting_anything(at_once: AtOnce) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        ran = toolq("serve", "--port", str(port), env=clean_env() | {"OPENAI_API_KEY": "test"})

    told(
        ran,
        2,
        f"error: cannot listen on 127.0.0.1:{port}: address already in use; choose another "
        "--port, or stop what listens there",
    )
    # A local stack (Redis and two workers) takes seconds to start; this took none of them.
    at_once(ran)


# -- tool calls that fail ------------------------------------------------------------------------

FAILING_CALLS = Script.from_steps(
    [
        {
            "tool_calls": [
                {"name": "write_file", "arguments": {"path": "a.txt", "content": "a"}},
                {"name": "read_file", "arguments": {}},
                {"name": "remove_everything", "arguments": {}},
            ]
        },
        {"content": "Some of that worked."},
    ]
)


@pytest.fixture(scope="module")
def failing_model() -> Iterator[ScriptedServer]:
    with ScriptedServer(FAILING_CALLS) as server:
        yield server


def test_run_names_each_failed_call_and_exits_0_once_the_model_answered(
    fleet: WorkerFleet, failing_model: ScriptedServer
) -> None:
    env = fleet_env(fleet, OPENAI_BASE_URL=failing_model.base_url, OPENAI_API_KEY="test")

    ran = toolq("run", "tidy up", "--model", "scripted", env=env)

    # Only what the model may call: remove and run_bash are off unless enabled.
    offered = [s.name for s in fleet_tools(fleet) if s.enabled_by_default and s.for_model]
    assert "read_file" in offered and "remove" not in offered and "run_bash" not in offered
    assert ran.returncode == 0, ran.stderr
    assert "Traceback" not in ran.stderr
    # In the order they failed: the unknown tool at once, the bad arguments on a worker.
    assert ran.stderr.splitlines() == [
        "✗ remove_everything failed (unknown_tool): Error: tool 'remove_everything' was not "
        f"found. Available tools: {', '.join(offered)}.",
        "✗ read_file failed (invalid_arguments): Error: invalid arguments for read_file: "
        "'path': Field required.",
    ]
    assert ran.stdout == "Some of that worked.\n"


def fleet_tools(fleet: WorkerFleet) -> list[ToolSpec]:
    client = redis.Redis.from_url(fleet.settings.redis_url)
    try:
        return list(read_manifest(client).values())
    finally:
        client.close()


def test_fail_on_tool_error_makes_a_failed_call_exit_1(
    fleet: WorkerFleet, failing_model: ScriptedServer
) -> None:
    env = fleet_env(fleet, OPENAI_BASE_URL=failing_model.base_url, OPENAI_API_KEY="test")

    ran = toolq("run", "tidy up", "--model", "scripted", "--fail-on-tool-error", env=env)

    assert ran.returncode == 1, ran.stderr
    assert len(ran.stderr.splitlines()) == 2
    assert ran.stdout == "Some of that worked.\n"


def test_a_batch_line_enabling_a_tool_no_worker_serves_is_refused_up_front(
    fleet: WorkerFleet, failing_model: ScriptedServer, tmp_path: Path
) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text(
        '{"id": "fine", "prompt": "go", "enable": ["run_bash"]}\n'
        '{"id": "typo", "prompt": "go", "enable": ["run_bahs", "remove"]}\n'
    )
    output = tmp_path / "out.jsonl"
    env = fleet_env(fleet, OPENAI_BASE_URL=failing_model.base_url, OPENAI_API_KEY="test")

    ran = toolq("batch", str(source), "-o", str(output), "--model", "scripted", env=env)

    assert ran.returncode == 1, ran.stderr
    assert ran.stderr.splitlines()[0].startswith(
        f"{source}:2: skipped: enable: no worker serves a tool named 'run_bahs' (tools: read_file,"
    )
    assert "1 ok, 0 error, 1 bad lines skipped" in ran.stderr
    assert [record["id"] for record in finished_records(output)] == ["fine"]


# -- conventions ---------------------------------------------------------------------------------


def test_version_and_short_help() -> None:
    version = toolq("--version", env=clean_env())
    short = toolq("-h", env=clean_env())
    long = toolq("--help", env=clean_env())

    assert version.returncode == 0
    assert version.stdout.startswith("toolq ")
    assert short.returncode == 0
    assert short.stdout == long.stdout
    assert "--version" in short.stdout


def test_a_wrong_option_is_an_error_line_as_every_other(at_once: AtOnce) -> None:
    ran = toolq("prune", "--older-than", "soon", env=clean_env())

    told(
        ran,
        2,
        "error: Invalid value for --older-than: 'soon' is not a duration: give a number of "
        "seconds, or one with a unit (s, m, h, d, w), such as 30m or 7d (toolq prune -h shows "
        "its options)",
    )
    assert "Error" not in ran.stderr
    at_once(ran)


def test_report_refuses_a_batchs_input(tmp_path: Path, at_once: AtOnce) -> None:
    source = tmp_path / "in.jsonl"
    source.write_text("".join(f'{{"id": "q{n}", "prompt": "hi"}}\n' for n in range(62)))

    ran = toolq("report", str(source), env=clean_env())

    told(
        ran,
        2,
        f"error: {source} holds no batch results: none of its 62 lines is a result (an object "
        "with an id and a status); toolq report reads what toolq batch -o writes, not a "
        "batch's input",
    )
    assert ran.stdout == ""
    at_once(ran)


@pytest.mark.parametrize("command", COMMANDS)
def test_help_shows_flags_without_a_value(command: str) -> None:
    # Help works even with wrong settings: it starts nothing.
    ran = toolq(command, "-h", env=clean_env() | {"TOOLQ_BROKR_URL": "x"})

    assert ran.returncode == 0, ran.stderr
    assert "<bool>" not in ran.stdout
    assert "-h, --help" in ran.stdout
    if command == "run":
        assert "  --stream  " in ran.stdout
        assert "--fail-on-tool-error" in ran.stdout
