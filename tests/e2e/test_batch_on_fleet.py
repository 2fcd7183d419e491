"""``toolq batch --on-fleet``: the conversations run on real agents workers, which send their
tool calls to the session's workers; the batch process only sends, waits and writes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import redis

from api.local.stack import worker_environment
from api.scripted.server import ScriptedServer
from tests.conftest import AgentsWorker, StartModel, WorkerFleet, wait_for
from tests.e2e.test_batch_cli import batch_argv, run_batch, workspace, write_items
from tests.results_file import finished_records as records
from tests.scripts import WRITE_THEN_READ
from worker.contract.keys import conversation_keys

pytestmark = pytest.mark.e2e

RUN_TIMEOUT_S = 90
#: A model that takes a while over its one tool call, so conversations are in flight for long
#: enough to be cut: slow_write leaves a mark in the workspace each time it runs.
SLOW_CONVERSATION: list[dict[str, Any]] = [
    {
        "tool_calls": [{"name": "slow_write", "arguments": {"seconds": 0.5, "marker": "m"}}],
        "fault": {"kind": "stall", "seconds": 1.0},
    },
    {"content": "done"},
]

AgentsAsking = Callable[[list[dict[str, Any]], int], tuple[ScriptedServer, list[AgentsWorker]]]


@pytest.fixture
def agents_asking(
    fleet: WorkerFleet, start_model: StartModel, agents_workers: Callable[..., AgentsWorker]
) -> AgentsAsking:
    """``agents_asking(steps, count)``: a model scripted with ``steps``, and ``count`` agents
    workers on the fleet that ask it."""

    def start(steps: list[dict[str, Any]], count: int) -> tuple[ScriptedServer, list[AgentsWorker]]:
        server = start_model(steps)
        return server, [agents_workers(fleet.settings, server.base_url) for _ in range(count)]

    return start


def batch_files(folder: Path, lines: list[dict[str, Any] | str]) -> tuple[Path, Path]:
    """The batch's input file, of ``lines``, and where its results go."""
    return write_items(folder / "in.jsonl", lines), folder / "out.jsonl"


def batch_env(fleet: WorkerFleet) -> dict[str, str]:
    """The batch process's environment: the fleet, and no model at all (the agents ask it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TOOLQ_"))}
    return env | worker_environment(fleet.settings)


def run_on_fleet(
    source: Path, output: Path, env: dict[str, str], concurrency: int = 8
) -> subprocess.CompletedProcess[str]:
    return run_batch(source, output, env, concurrency, "--on-fleet")


def start_on_fleet(
    source: Path, output: Path, env: dict[str, str], log: Path, concurrency: int = 8
) -> subprocess.Popen[bytes]:
    with log.open("wb") as stderr:
        return subprocess.Popen(
            batch_argv(source, output, concurrency, "--on-fleet"),
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=stderr,
        )


def items(count: int, prefix: str = "c") -> list[dict[str, Any] | str]:
    return [{"id": f"{prefix}{n:03}", "prompt": f"note {n}"} for n in range(count)]


def leases_held_by(fleet: WorkerFleet, worker: AgentsWorker) -> set[str]:
    """The conversations whose lease names ``worker``: those it runs right now."""
    client = redis.Redis.from_url(fleet.settings.redis_url, decode_responses=True)
    try:
        found = set()
        for key in client.scan_iter(conversation_keys.lease("*"), count=1000):
            holder = str(client.get(key) or "")
            if holder.endswith(f" {worker.process_name}"):
                found.add(key.split(":")[-2])
        return found
    finally:
        client.close()


def marks(fleet: WorkerFleet, record: dict[str, Any]) -> int:
    """How often the conversation's slow_write started, on any run of it."""
    runs = workspace(fleet, record) / "m.runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def test_a_batch_on_two_agents_workers_runs_every_item_once(
    fleet: WorkerFleet, agents_asking: AgentsAsking, tmp_path: Path
) -> None:
    server, agents = agents_asking(WRITE_THEN_READ, 2)
    total = 30
    source, output = batch_files(tmp_path, items(total))

    done = run_on_fleet(source, output, batch_env(fleet))

    assert done.returncode == 0, done.stderr + "\n".join(a.log_tail() for a in agents)
    assert f"Finished: {total} ok, 0 error, 0 bad lines skipped, 0 already done" in done.stderr
    results = records(output)
    assert sorted(r["id"] for r in results) == [f"c{n:03}" for n in range(total)]
    assert {r["status"] for r in results} == {"ok"}
    assert {r["attempts"] for r in results} == {1}
    # Both agents workers ran conversations, whose tool calls ran on the tool workers.
    assert Counter(r["orchestrator"] for r in results).keys() == {a.process_name for a in agents}
    for result in results:
        assert [c["name"] for c in result["tool_calls"]] == ["write_file", "read_file"]
        assert all(c["worker"] not in (None, "orchestrator") for c in result["tool_calls"])
        prompt = f"note {int(result['id'][1:])}"
        assert result["answer"] == f"Read back: {prompt}"
        assert (workspace(fleet, result) / "note.txt").read_text() == prompt
    # Each conversation asked the model its three questions once, from the agents workers.
    assert server.stats()["requests"] == 3 * total


def test_an_agents_worker_killed_mid_batch_loses_and_repeats_no_line(
    fleet: WorkerFleet, agents_asking: AgentsAsking, tmp_path: Path
) -> None:
    _, (doomed, survivor) = agents_asking(SLOW_CONVERSATION, 2)
    total = 24
    source, output = batch_files(tmp_path, items(total, prefix="k"))
    batch = start_on_fleet(source, output, batch_env(fleet), tmp_path / "batch.log")
    try:
        wait_for(lambda: len(leases_held_by(fleet, doomed)) >= 2, 60, "the doomed worker at work")
        doomed.kill()
        cut = leases_held_by(fleet, doomed)  # leases outlive their worker: these were cut
        code = batch.wait(RUN_TIMEOUT_S)
    finally:
        if batch.poll() is None:
            batch.kill()
    log = (tmp_path / "batch.log").read_text()
    assert code == 0, log + survivor.log_tail()
    lines = output.read_text().splitlines()
    results = [json.loads(line) for line in lines]
    assert len(lines) == total
    assert sorted(r["id"] for r in results) == [f"k{n:03}" for n in range(total)]
    assert {r["status"] for r in results} == {"ok"}
    rerun = {r["run_id"]: r for r in results if r["attempts"] > 1}
    assert cut and cut <= set(rerun), (cut, set(rerun))
    for record in rerun.values():
        assert record["attempts"] == 2
        assert record["orchestrator"] == survivor.process_name
        # A run cut short may have started its tool call: at most one mark per run.
        assert 1 <= marks(fleet, record) <= 2
    for record in results:
        if record["attempts"] == 1:
            assert marks(fleet, record) == 1


def test_a_batch_with_no_agents_worker_says_so_at_once(fleet: WorkerFleet, tmp_path: Path) -> None:
    source, output = batch_files(tmp_path, items(3))

    done = run_on_fleet(source, output, batch_env(fleet))

    assert done.returncode == 1
    assert "error: no agents worker is live on this broker" in done.stderr
    # Said before anything was sent, not after waiting for a worker to show up ("none for").
    assert "(none for" not in done.stderr
    assert "toolq worker --pool agents" in done.stderr
    assert "--on-fleet" in done.stderr  # in the command to resume with
    assert not output.exists() or output.read_text() == ""


def test_a_killed_on_fleet_batch_resumes_without_asking_the_model_again(
    fleet: WorkerFleet, agents_asking: AgentsAsking, tmp_path: Path
) -> None:
    server, _ = agents_asking(SLOW_CONVERSATION, 1)
    total = 20
    source, output = batch_files(tmp_path, items(total, prefix="r"))
    env = batch_env(fleet)
    batch = start_on_fleet(source, output, env, tmp_path / "killed.log", concurrency=6)
    try:
        wait_for(
            lambda: output.exists() and output.read_bytes().count(b"\n") >= 4,
            RUN_TIMEOUT_S,
            "a few results",
        )
    finally:
        batch.send_signal(signal.SIGKILL)
        batch.wait(10)
    finished_before = len(records(output))
    assert finished_before < total

    resumed = run_on_fleet(source, output, env, concurrency=6)

    assert resumed.returncode == 0, resumed.stderr
    assert f"{finished_before} already done" in resumed.stderr
    results = records(output)
    assert sorted(r["id"] for r in results) == [f"r{n:03}" for n in range(total)]
    assert {r["status"] for r in results} == {"ok"}
    # The conversations in flight when the batch died went on on the agents worker; the
    # resumed batch took their answers: none ran twice, none asked the model twice.
    assert {r["attempts"] for r in results} == {1}
    assert all(marks(fleet, r) == 1 for r in results)
    assert server.stats()["requests"] == 2 * total
