"""``toolq batch`` as a user runs it: a scripted model, the real command, real workers."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from api.batch.attempts import attempts_path
from api.local.stack import worker_environment
from api.scripted.server import ScriptedServer
from tests.conftest import StartModel, WorkerFleet, wait_for
from tests.results_file import finished_lines, finished_records, finished_text
from tests.scripts import WRITE_THEN_READ

pytestmark = pytest.mark.e2e

TOOLQ = Path(sys.executable).parent / "toolq"
RUN_TIMEOUT_S = 60
#: A thousand conversations take about 30 s on this 2-core machine when nothing else runs, and
#: took over 90 s beside a CPU burner and the suite's other process: the bound names a hang.
THOUSAND_TIMEOUT_S = 240
#: Threads a process may gain under load without one per conversation: asyncio's default
#: executor (name lookups for new connections) grows up to this many.
EXECUTOR_THREADS = min(32, (os.cpu_count() or 1) + 4)

#: One slow tool call that leaves a mark in the workspace each time it runs.
SLOW_MARKED_CALL: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "slow_write", "arguments": {"seconds": 0.3, "marker": "m"}}]},
    {"content": "done"},
]
#: A command with an effect, then a pause before the answer: a kill mid-batch finds conversations
#: whose command ran and that have not finished.
APPEND_THEN_PAUSE: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "run_bash", "arguments": {"command": "echo x >> ran.txt"}}]},
    {"content": "appended", "fault": {"kind": "stall", "seconds": 1.0}},
]
#: A model that takes STALL_S to make one tool call, so conversations overlap for a while.
STALL_S = 2.0
SLOW_MODEL_ONE_CALL: list[dict[str, Any]] = [
    {
        "tool_calls": [{"name": "noop", "arguments": {}}],
        "fault": {"kind": "stall", "seconds": STALL_S},
    },
    {"content": "ok"},
]


def environment(fleet: WorkerFleet, server: ScriptedServer) -> dict[str, str]:
    return {
        **os.environ,
        **worker_environment(fleet.settings),
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "test",
    }


def batch_argv(source: Path, output: Path, concurrency: int, *more: str) -> list[str]:
    return [
        str(TOOLQ),
        "batch",
        str(source),
        "-o",
        str(output),
        "--concurrency",
        str(concurrency),
        "--model",
        "scripted",
        *more,
    ]


def run_batch(
    source: Path, output: Path, env: dict[str, str], concurrency: int = 8, *more: str
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        batch_argv(source, output, concurrency, *more),
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def write_items(path: Path, items: list[dict[str, Any] | str]) -> Path:
    path.write_text(
        "".join(
            (i if isinstance(i, str) else json.dumps(i, ensure_ascii=False)) + "\n" for i in items
        )
    )
    return path


def workspace(fleet: WorkerFleet, record: dict[str, Any]) -> Path:
    return Path(fleet.settings.workspace_root) / str(record["run_id"])


def test_a_batch_runs_every_good_line_once_and_reports_the_bad_ones(
    fleet: WorkerFleet, start_model: StartModel, tmp_path: Path
) -> None:
    server = start_model(WRITE_THEN_READ)
    prompts = {f"item {n}": f"note {n}: ünïcödé" for n in range(6)}
    source = write_items(
        tmp_path / "in.jsonl",
        [
            *({"id": item_id, "prompt": prompt} for item_id, prompt in prompts.items()),
            "this is not json",
            {"id": "item 0", "prompt": "the same id again"},
            {"id": "x", "prompt": "p", "temperature": 0.2},
        ],
    )
    output = tmp_path / "out.jsonl"

    done = run_batch(source, output, environment(fleet, server))

    assert done.returncode == 1, done.stderr  # some lines were bad
    assert "in.jsonl:7: skipped: not JSON" in done.stderr
    assert "in.jsonl:8: skipped: duplicate id 'item 0' (first on line 1)" in done.stderr
    assert "in.jsonl:9: skipped: unknown field 'temperature'" in done.stderr
    assert "Finished: 6 ok, 0 error, 3 bad lines skipped, 0 already done" in done.stderr
    results = finished_records(output)
    assert sorted(r["id"] for r in results) == sorted(prompts)
    for result in results:
        assert result["status"] == "ok", result["error"]
        assert result["error"] is None
        assert result["answer"] == f"Read back: {prompts[result['id']]}"
        calls = result["tool_calls"]
        assert [c["name"] for c in calls] == ["write_file", "read_file"]
        assert all(c["worker"] and c["worker"] != "orchestrator" for c in calls)
        assert all(not c["is_error"] and c["duration_ms"] > 0 for c in calls)
        assert result["usage"]["total_tokens"] > 0
        note = workspace(fleet, result) / "note.txt"
        assert note.read_text() == prompts[result["id"]]
    assert len({r["run_id"] for r in results}) == len(prompts)

    requests = server.stats()["requests"]
    again = run_batch(source, output, environment(fleet, server))
    assert "Finished: 0 ok, 0 error, 3 bad lines skipped, 6 already done" in again.stderr
    assert server.stats()["requests"] == requests
    assert len(finished_records(output)) == len(prompts)


def start_batch(
    source: Path, output: Path, env: dict[str, str], log: Path
) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(
            batch_argv(source, output, concurrency=4),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def wait_for_lines(output: Path, count: int) -> None:
    wait_for(
        lambda: len(finished_lines(output)) >= count,
        timeout=RUN_TIMEOUT_S,
        what=f"{count} results in {output.name}",
    )


def tool_runs(fleet: WorkerFleet, output: Path) -> dict[str, int]:
    """How often the slow tool ran for each finished conversation."""
    return {
        r["id"]: len((workspace(fleet, r) / "m.runs").read_text().splitlines())
        for r in finished_records(output)
    }


def test_an_interrupted_then_killed_batch_resumes_without_losing_or_repeating_work(
    fleet: WorkerFleet, start_model: StartModel, tmp_path: Path
) -> None:
    server = start_model(SLOW_MARKED_CALL)
    total = 40
    source = write_items(
        tmp_path / "in.jsonl", [{"id": f"job-{n}", "prompt": "go"} for n in range(total)]
    )
    output = tmp_path / "out.jsonl"
    env = environment(fleet, server)

    # Ctrl-C: a clean stop that says how to go on.
    interrupted = start_batch(source, output, env, tmp_path / "interrupted.log")
    try:
        wait_for_lines(output, 4)
    finally:
        interrupted.send_signal(signal.SIGINT)
    try:
        code = interrupted.wait(timeout=30)
    except subprocess.TimeoutExpired:
        interrupted.kill()
        interrupted.wait(timeout=30)
        pytest.fail("the batch did not stop within 30 s of SIGINT")
    assert code == 130
    stderr = (tmp_path / "interrupted.log").read_text()
    assert "SIGINT: stopping" in stderr
    assert re.search(r"^Interrupted: \d+ ok, 0 error", stderr, re.MULTILINE)
    assert f"Resume with: toolq batch {source} -o {output} --concurrency 4" in stderr
    assert output.read_text().endswith("\n")
    runs_after_interrupt = tool_runs(fleet, output)

    # A kill: whatever it was writing is cut off.
    killed = start_batch(source, output, env, tmp_path / "killed.log")
    try:
        wait_for_lines(output, len(runs_after_interrupt) + 4)
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
    before = finished_text(output)
    finished_before = {record["id"] for record in finished_records(output)}
    assert len(finished_before) < total
    runs_before = tool_runs(fleet, output)
    with output.open("a") as torn:  # as a kill in the middle of a write would leave it
        torn.write('{"id": "job-39", "status": "o')
    requests_before = server.stats()["requests"]

    resumed = run_batch(source, output, env, concurrency=4)

    assert resumed.returncode == 0, resumed.stderr
    assert "removed an unfinished last line" in resumed.stderr
    assert f"{len(finished_before)} already done" in resumed.stderr
    results = finished_records(output)
    assert sorted(r["id"] for r in results) == sorted(f"job-{n}" for n in range(total))
    assert all(r["status"] == "ok" for r in results)
    assert output.read_text().startswith(before)
    # Finished conversations were not asked of the model again, nor did their tools run again.
    assert server.stats()["requests"] - requests_before == 2 * (total - len(finished_before))
    runs_after = tool_runs(fleet, output)
    assert {name: runs_after[name] for name in runs_before} == runs_before
    assert {name: runs_after[name] for name in runs_after_interrupt} == runs_after_interrupt


def cut_after_their_effect(fleet: WorkerFleet, output: Path) -> list[str]:
    """The workspaces of conversations started and not finished whose command has run."""
    started = {
        attempt["id"]: attempt["run_id"]
        for attempt in finished_records(attempts_path(output))  # the last attempt of each id
    }
    done = {record["id"] for record in finished_records(output)}
    root = Path(fleet.settings.workspace_root)
    return [
        run_id
        for item_id, run_id in started.items()
        if item_id not in done and (root / run_id / "ran.txt").exists()
    ]


def test_a_conversation_cut_by_a_kill_runs_again_in_a_workspace_of_its_own(
    fleet: WorkerFleet, start_model: StartModel, tmp_path: Path
) -> None:
    server = start_model(APPEND_THEN_PAUSE)
    total = 30
    ids = [f"job-{n}" for n in range(total)]
    source = write_items(
        tmp_path / "in.jsonl", [{"id": i, "prompt": "go", "enable": ["run_bash"]} for i in ids]
    )
    output = tmp_path / "out.jsonl"
    env = environment(fleet, server)

    killed = start_batch(source, output, env, tmp_path / "killed.log")
    try:
        wait_for(
            lambda: (
                len(finished_lines(output)) >= 4 and bool(cut_after_their_effect(fleet, output))
            ),
            timeout=RUN_TIMEOUT_S,
            what="a conversation whose command ran to be in flight, after 4 results",
        )
    finally:
        killed.send_signal(signal.SIGKILL)
        killed.wait(timeout=10)
    finished_before = {record["id"] for record in finished_records(output)}
    assert len(finished_before) < total
    cut = set(cut_after_their_effect(fleet, output))

    resumed = run_batch(source, output, env, concurrency=4)

    assert resumed.returncode == 0, resumed.stderr
    results = finished_records(output)
    assert sorted(r["id"] for r in results) == sorted(ids)
    assert all(r["status"] == "ok" for r in results), [r["error"] for r in results]
    # Every result's workspace saw its command once: the one attempt that worked there.
    assert {r["id"]: ran_lines(fleet, r["run_id"]) for r in results} == dict.fromkeys(ids, 1)
    again = [r for r in results if r["id"] not in finished_before]
    resumed_items = [r for r in again if r["attempts"] > 1]
    assert resumed_items, "the kill cut no conversation"
    for record in resumed_items:
        earlier = record["earlier_run_ids"]
        assert record["attempts"] == 2
        assert len(earlier) == 1 and earlier[0] != record["run_id"]
        assert record["run_id"] == f"{earlier[0]}-a2"
        # The cut attempt's workspace is kept as it left it: its command ran there at most once.
        assert ran_lines(fleet, earlier[0]) <= 1
    # Those cut after their command ran are among them, their workspace set aside as it was.
    set_aside = {run_id for r in resumed_items for run_id in r["earlier_run_ids"]}
    assert cut <= set_aside, (cut, set_aside)
    assert {run_id: ran_lines(fleet, run_id) for run_id in cut} == dict.fromkeys(cut, 1)
    for record in results:
        if record["id"] in finished_before or record["attempts"] == 1:
            assert record["earlier_run_ids"] == []


def ran_lines(fleet: WorkerFleet, run_id: str) -> int:
    """How often the command ran in the workspace of ``run_id``."""
    ran = Path(fleet.settings.workspace_root) / run_id / "ran.txt"
    return len(ran.read_text().splitlines()) if ran.exists() else 0


def run_sampling_threads(
    source: Path, output: Path, env: dict[str, str], concurrency: int, timeout: float
) -> tuple[subprocess.CompletedProcess[str], int, float]:
    """Run the batch; the most threads its process had, and how long it took."""
    # Its output goes to files: a pipe nobody reads while the threads are sampled would stop
    # the batch at its first write past the pipe's 64 KB (a loaded fleet's log lines).
    out_path, err_path = output.with_suffix(".stdout"), output.with_suffix(".stderr")
    started = time.monotonic()
    with out_path.open("w") as out, err_path.open("w") as err:
        proc = subprocess.Popen(
            batch_argv(source, output, concurrency), env=env, stdout=out, stderr=err
        )
    peak = 0
    deadline = started + timeout
    status = Path(f"/proc/{proc.pid}/status")
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            threads = re.search(r"^Threads:\s+(\d+)", status.read_text(), re.MULTILINE)
        except OSError:  # it exited between the check and the read
            break
        if threads:
            peak = max(peak, int(threads.group(1)))
        time.sleep(0.02)
    try:
        proc.wait(timeout=max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=30)
        # What it logged, without its progress lines: why its calls waited (the first lines
        # say what went wrong, the last what it was doing at the end).
        lines = err_path.read_text().splitlines()
        logged = [line for line in lines if not line.startswith("batch: ")]
        shown = logged if len(logged) <= 40 else [*logged[:20], "...", *logged[-20:]]
        pytest.fail(
            f"the batch at concurrency {concurrency} took over {timeout} s; it logged:\n"
            + "\n".join(shown)
        )
    elapsed = time.monotonic() - started
    stdout, stderr = out_path.read_text(), err_path.read_text()
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), peak, elapsed


@pytest.mark.timeout(RUN_TIMEOUT_S + THOUSAND_TIMEOUT_S + 60)
def test_a_thousand_conversations_run_at_once_without_a_thread_each(
    fleet: WorkerFleet, start_model: StartModel, tmp_path: Path
) -> None:
    server = start_model(SLOW_MODEL_ONE_CALL)
    env = environment(fleet, server)
    small = write_items(
        tmp_path / "small.jsonl", [{"id": f"s{n}", "prompt": f"s{n}"} for n in range(10)]
    )
    _, threads_at_10, _ = run_sampling_threads(
        small, tmp_path / "small.out", env, 10, RUN_TIMEOUT_S
    )

    count = 1000
    source = write_items(
        tmp_path / "in.jsonl",
        [{"id": f"c{n}", "prompt": f"conversation {n}"} for n in range(count)],
    )
    output = tmp_path / "out.jsonl"
    done, threads_at_1000, elapsed = run_sampling_threads(
        source, output, env, count, THOUSAND_TIMEOUT_S
    )

    assert done.returncode == 0, done.stderr[-3000:]
    results = finished_records(output)
    assert len(results) == count
    assert {r["id"] for r in results} == {f"c{n}" for n in range(count)}
    assert all(r["status"] == "ok" and len(r["tool_calls"]) == 1 for r in results)
    assert all(r["tool_calls"][0]["worker"] for r in results)
    # Conversations in flight on average (Little's law): about half of all of them when they
    # all start at once, and never more than the concurrency.
    assert sum(r["duration_s"] for r in results) / elapsed > 250
    assert threads_at_10 > 0
    assert threads_at_1000 <= threads_at_10 + EXECUTOR_THREADS, (threads_at_10, threads_at_1000)
    # Off a terminal: plain progress lines, then the summary.
    assert re.search(r"^batch: 1000/1000 done \(100%\), 0 failed, ", done.stderr, re.MULTILINE)
    assert "Finished: 1000 ok, 0 error, 0 bad lines skipped, 0 already done" in done.stderr
    assert re.search(r"^Conversation time: p50 \d+\.\d\d s, p95 \d+\.\d\d s$", done.stderr, re.M)
    assert re.search(r"^Tool calls: 1000 \(.*/s\), 0 failed \(0\.0%\)$", done.stderr, re.M)
