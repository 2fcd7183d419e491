"""A task batch on a fleet whose disk the orchestrator cannot see.

The workers of both pools run in a mount namespace of their own, with a private tmpfs over
their workspace root: the folder the orchestrator sees at that path stays empty, as on a machine
of its own. Files, set-up, check and artifacts must then all go through the queue.

A private mount is what a remote fleet takes away (a disk in common); the network is not in
question, since orchestrator and workers only ever meet in Redis. Unlike the named network
namespaces of tests/netns, it needs no names shared with other runs on this machine.
"""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from api.calls.fleet import live_workers
from api.local.stack import worker_argv, worker_environment
from tests.conftest import RedisServer, fleet_settings, scripted_server, wait_for
from tests.e2e.test_batch_cli import run_batch, write_items
from tests.results_file import finished_records as records
from worker.contract.settings import WorkerSettings
from worker.contract.wire import POOLS

pytestmark = [
    pytest.mark.e2e,
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("unshare") is None,
        reason="needs root and unshare(1) for a private mount namespace",
    ),
]


class PrivateFleet:
    """Both pools' workers in one private mount namespace, their workspace root a private tmpfs."""

    def __init__(self, settings: WorkerSettings, log: Path) -> None:
        self.settings = settings
        root = shlex.quote(str(settings.workspace_root))
        workers = " ".join(
            shlex.join(
                worker_argv(
                    pool,
                    node=f"{pool}-private@%h",
                    concurrency=1,
                    loglevel="WARNING",
                    extra=("--without-gossip", "--without-mingle"),
                )
            )
            + " &"
            for pool in POOLS
        )
        script = (
            f"mount -t tmpfs -o mode=0755 toolq-private {root} || exit 97\n"
            f"{workers}\n"
            "trap 'kill -TERM $(jobs -p); wait' TERM\n"
            "wait\n"
        )
        with log.open("wb") as output:
            self.proc = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                env={**os.environ, **worker_environment(settings)},
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.log = log

    def wait_ready(self) -> dict[str, int]:
        """The pid of each pool's worker once its heartbeat is in."""
        client = redis.Redis.from_url(self.settings.redis_url)
        try:

            def ready() -> bool:
                assert self.proc.poll() is None, self.log.read_text()
                return all(live_workers(client, pool) for pool in POOLS)

            wait_for(ready, timeout=60, what="the private workers' heartbeats")
            return {pool: live_workers(client, pool)[0].pid for pool in POOLS}
        finally:
            client.close()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=30)


@pytest.fixture
def private_fleet(tmp_path: Path) -> Iterator[tuple[PrivateFleet, dict[str, int]]]:
    server = RedisServer(tmp_path)
    server.start()
    root = tmp_path / "workspaces"
    root.mkdir(mode=0o755)
    fleet = PrivateFleet(fleet_settings(server.url, root), tmp_path / "workers.log")
    try:
        yield fleet, fleet.wait_ready()
    finally:
        fleet.stop()
        server.stop()


#: Reads the question, writes its answer to a file, and says it.
READ_AND_WRITE: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "read_file", "arguments": {"path": "question.txt"}}]},
    {
        "tool_calls": [
            {"name": "write_file", "arguments": {"path": "out/answer.txt", "content": "4\n"}}
        ]
    },
    {"content": "The answer is 4."},
]
CHECK = "cmp -s expected.txt out/answer.txt && echo matches"


def test_a_task_runs_where_the_orchestrator_shares_no_disk_with_the_workers(
    private_fleet: tuple[PrivateFleet, dict[str, int]], tmp_path: Path
) -> None:
    fleet, pids = private_fleet
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    source = write_items(
        tmp_path / "in.jsonl",
        [
            {
                "id": "remote",
                "prompt": "Answer the question in question.txt",
                "model": "scripted:sum",
                "files": {"question.txt": "2 + 2 = ?", "tool.bin": {"base64": "//4A"}},
                "setup": "python3 -c 'print(2 + 2)' > expected.txt",
                "check": CHECK,
                "artifacts": ["out/*", "*.bin"],
                "target": "4",
            }
        ],
    )
    output = tmp_path / "out.jsonl"
    with scripted_server(scripts, {"sum": READ_AND_WRITE}) as model:
        env = {
            **os.environ,
            **worker_environment(fleet.settings),
            "OPENAI_BASE_URL": model.base_url,
            "OPENAI_API_KEY": "test",
        }
        done = run_batch(source, output, env)

    [result] = records(output)
    assert result["status"] == "ok", (result["error"], fleet.log.read_text())
    assert done.returncode == 0, done.stderr
    assert result["tool_calls"][0]["output"] == "2 + 2 = ?"
    assert result["setup"]["exit_code"] == 0
    assert result["score"] == {
        "passed": True,
        "method": "both",
        "explanation": "target: the answer contains '4'\ncheck: matches\n",
    }
    assert result["artifacts"]["out/answer.txt"]["content"] == "4\n"
    assert result["artifacts"]["tool.bin"] == {
        "content": "//4A",
        "encoding": "base64",
        "size": 3,
        "truncated": False,
    }
    # The orchestrator's view of the workspace root is empty; the workers' holds the run.
    assert list(Path(fleet.settings.workspace_root).iterdir()) == []
    for pool in POOLS:
        seen = Path(f"/proc/{pids[pool]}/root") / str(fleet.settings.workspace_root).lstrip("/")
        assert (seen / result["run_id"] / "expected.txt").read_text() == "4\n"
