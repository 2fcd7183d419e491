"""bash_session as a model uses it, on a fleet of real workers: a shell that keeps its folder,
variables, functions and background servers between calls, interactive programs under a
terminal, Ctrl-C, several sessions by name, bad input refused in one line."""

from __future__ import annotations

import pytest

from tests.conftest import Caller, wait_for
from tests.worker.sessions.helpers import (
    WAIT_MS,
    free_port,
    processes_with,
    session,
    session_result,
    token,
    wait_for_sleep,
)

pytestmark = pytest.mark.integration


async def test_the_folder_variables_and_functions_stay_between_calls(call: Caller) -> None:
    made = await session(
        call, "type_submit", "mkdir -p sub && cd sub && export X=1; f() { echo fn; }"
    )
    assert made["exit_code"] == 0 and made["running"] is False

    answer = await session(call, "type_submit", "pwd; echo $X; f")

    assert answer["output"].splitlines() == [
        f"{call.settings.workspace_root}/{call.run_id}/sub",
        "1",
        "fn",
    ]
    assert answer["exit_code"] == 0


async def test_a_server_started_in_one_call_answers_curl_in_the_next(call: Caller) -> None:
    port = free_port()
    started = await session(
        call, "type_submit", f"python3 -m http.server {port} >server.log 2>&1 &"
    )
    assert started["exit_code"] == 0

    # Until it listens: bounded by the call's own wait, in the shell.
    answer = await session(
        call,
        "type_submit",
        f"for i in $(seq 50); do curl -s localhost:{port} >/dev/null && break; sleep 0.1; done; "
        f"curl -sS localhost:{port}/",
    )

    assert "Directory listing" in answer["output"], answer
    assert "server.log" in answer["output"]


async def test_an_interactive_python_is_driven_by_input_and_read_back(call: Caller) -> None:
    opened = await session(call, "type_submit", "python3 -q")
    assert opened["output"].endswith(">>> ") and opened["running"] is True

    answered = await session(call, "type_submit", "6 * 7")
    assert answered["output"] == "42\n>>> "

    await session(call, "type", "print('typed')")
    shown = await session(call, "type_submit", "")
    assert "typed\n>>> " in shown["output"]

    left = await session(call, "type_submit", "exit()")
    assert left["running"] is False and left["exit_code"] == 0


async def test_a_command_past_the_calls_time_keeps_running_until_ctrl_c(call: Caller) -> None:
    mark = token()
    await session(call, "type_submit", "true")  # the shell is up: the next call waits alone

    still = await session(call, "type_submit", f"sleep {mark}", timeout=500)

    assert still["running"] is True and "still runs" in still["notice"]
    assert processes_with(f"sleep {mark}")
    read = await session(call, "read")
    assert read["running"] is True
    stopped = await session(call, "interrupt")
    assert stopped["running"] is False and stopped["exit_code"] == 130
    wait_for(lambda: not processes_with(f"sleep {mark}"), 10, "the interrupted sleep to end")
    after = await session(call, "type_submit", "echo back")
    assert after["output"] == "back\n"


async def test_a_first_command_whose_wait_the_shells_start_used_up_still_runs(
    call: Caller,
) -> None:
    """The shell's start counts in the call's wait: with 1 ms, none is left to type in."""
    mark = token()

    first = await session(call, "type_submit", f"sleep {mark}", timeout=1)

    assert first["running"] is True
    wait_for_sleep(mark)
    stopped = await session(call, "interrupt")
    assert stopped["running"] is False and stopped["exit_code"] == 130


async def test_ctrl_c_to_a_program_that_keeps_running_answers_with_its_prompt(
    call: Caller,
) -> None:
    started = await session(call, "type_submit", "python3 -q")
    assert started["running"] is True and started["output"].endswith(">>> ")

    stopped = await session(call, "interrupt")

    assert "KeyboardInterrupt" in stopped["output"] and stopped["output"].endswith(">>> ")
    assert stopped["running"] is True and stopped["exit_code"] is None
    left = await session(call, "type_submit", "exit()")
    assert left["running"] is False and left["exit_code"] == 0


async def test_sessions_of_one_run_are_apart_by_name(call: Caller) -> None:
    await session(call, "type_submit", "cd /tmp && export WHERE=one", session="one")

    other = await session(call, "type_submit", "pwd; echo ${WHERE:-unset}", session="two")
    one = await session(call, "type_submit", "pwd; echo $WHERE", session="one")

    assert other["output"] == f"{call.settings.workspace_root}/{call.run_id}\nunset\n"
    assert one["output"] == "/tmp\none\n"


async def test_restart_ends_the_shell_and_all_it_started(call: Caller) -> None:
    mark = token()
    await session(call, "type_submit", f"export X=1; sleep {mark} &")
    wait_for_sleep(mark)

    restarted = await session(call, "restart")

    assert "new shell" in restarted["notice"]
    assert not processes_with(f"sleep {mark}")
    fresh = await session(call, "type_submit", "echo ${X:-unset}")
    assert fresh["output"] == "unset\n"


async def test_output_past_the_cap_keeps_the_latest(call: Caller) -> None:
    answer = await session(call, "type_submit", "seq 1 40000; echo last")

    assert answer["truncated"] is True and "cut" in answer["notice"]
    assert answer["output"].endswith("40000\nlast\n")
    assert len(answer["output"].encode()) <= call.settings.output_cap_bytes


@pytest.mark.parametrize(
    ("arguments", "problem"),
    [
        ({"action": "type_submit"}, "needs an 'input'"),
        ({"action": "read", "input": "ls"}, "takes no 'input'"),
        ({"action": "type_submit", "input": "ls", "session": "../other"}, "session"),
        ({"action": "paste", "input": "ls"}, "action"),
        ({"action": "type_submit", "input": "a\x00b"}, "NUL"),
    ],
)
async def test_bad_arguments_are_refused_in_one_line(
    call: Caller, arguments: dict[str, str], problem: str
) -> None:
    result = await call("bash_session", {**arguments, "timeout": WAIT_MS})

    assert result.is_error and result.error_kind == "invalid_arguments"
    assert problem in result.output and "\n" not in result.output.strip()


async def test_a_shell_that_exited_says_so_until_restarted(call: Caller) -> None:
    await session(call, "type_submit", "exit 3")

    gone = await session_result(call, "type_submit", "echo hi")

    answer = gone.output
    assert ("exited" in answer or "ended" in answer) and "restart" in answer, answer
    assert (await session(call, "restart"))["running"] is False
    assert (await session(call, "type_submit", "echo hi"))["output"] == "hi\n"


async def test_the_runs_calls_go_to_the_worker_holding_its_sessions(call: Caller) -> None:
    first = await session_result(call, "type_submit", "echo $$")

    assert first.holder is not None and first.holder.startswith("sandbox.")
    assert call.dispatcher.session_pins.holder(call.run_id) == first.holder
    again = await session_result(call, "type_submit", "echo $$")
    assert again.output == first.output  # the same shell
