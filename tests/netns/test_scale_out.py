"""Scale-out across hosts: a broker, two tools hosts, a sandbox host, two agents hosts and an
orchestrator, each in a network namespace of its own on a private bridge, running ``toolq batch``
(and ``toolq batch --on-fleet``) as a user would.

Processes on different test hosts share the file system (it plays the shared workspace volume)
but not the network. Each worker runs with its host's own host name (``unshare --uts``), so the
``worker`` field of a result (``hostname:pid``) names the host that ran the call.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from api.local.stack import redis_server_binary, worker_environment
from tests.conftest import REPO, fleet_settings, wait_for
from tests.netns.hosts import Host, Network, Started, netns_unavailable
from tests.results_file import finished_records
from worker.contract.keys import keys
from worker.contract.settings import WorkerSettings
from worker.contract.wire import AGENTS_QUEUE

pytestmark = [pytest.mark.netns, pytest.mark.integration]

TOOLQ = Path(sys.executable).with_name("toolq")
BROKER_PORT = 6379  # the broker host's own port 6379: namespaces do not share ports
MODEL_PORT = 8900
CONVERSATIONS = 60
#: A short deadline keeps the Redis transport's visibility timeout (hard limit + 60 s) and the
#: caller's wait for a lost call (deadline + grace + margin = 6 s) within a test's time.
MAX_TIMEOUT_MS = 3000
START_BOUND_S = 60.0
BATCH_BOUND_S = 90.0

TWO_CALLS: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "slow_write", "arguments": {"seconds": "{prompt}", "marker": "one"}}]},
    {"tool_calls": [{"name": "slow_write", "arguments": {"seconds": "{prompt}", "marker": "two"}}]},
    {"content": "done"},
]
MARKERS = ("one", "two")

_HEARTBEATS = """
import sys, redis
client = redis.Redis.from_url(sys.argv[1], socket_timeout=2)
sys.exit(0 if all(client.exists(key) for key in sys.argv[2:]) else 1)
"""
_STATS = """
import sys, urllib.request
print(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/stats", timeout=5).read().decode())
"""


@dataclass
class Cluster:
    network: Network
    broker: Host
    orchestrator: Host
    tools_a: Host
    tools_b: Host
    sandbox: Host
    agents_a: Host
    agents_b: Host
    settings: WorkerSettings
    workdir: Path
    workers: list[Started]

    def environment(
        self, settings: WorkerSettings | None = None, /, **extra: str
    ) -> dict[str, str]:
        """The machine's environment without toolq or model settings, then these."""
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TOOLQ_", "OPENAI_"))}
        env["PYTHONPATH"] = str(REPO)  # workers import the test plugins
        return {**env, **worker_environment(settings or self.settings), **extra}

    def logs(self) -> str:
        return "\n".join(f"--- {w.label}:\n{w.log_tail()}" for w in self.workers)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    unavailable = netns_unavailable()
    if unavailable:
        pytest.skip(unavailable)
    workdir = tmp_path_factory.mktemp("scale-out")
    workspaces = workdir / "workspaces"
    workspaces.mkdir()
    os.chmod(workspaces, 0o755)
    with Network() as network:
        broker = network.add_host("broker")
        orchestrator = network.add_host("orch")
        tools_a = network.add_host("toolsA")
        tools_b = network.add_host("toolsB")
        sandbox = network.add_host("sandbox", reach_only=broker)
        agents_a = network.add_host("agentsA")
        agents_b = network.add_host("agentsB")
        url = f"redis://{broker.address}:{BROKER_PORT}/0"
        settings = fleet_settings(
            url,
            workspaces,
            default_timeout_ms=MAX_TIMEOUT_MS,
            max_timeout_ms=MAX_TIMEOUT_MS,
            reply_margin_s=2.0,
        )
        network.start(broker, "redis", redis_argv(broker, workdir), env=os.environ)
        assert orchestrator.connect_error(broker.address, BROKER_PORT, patience_s=20) is None
        cluster = Cluster(
            network,
            broker,
            orchestrator,
            tools_a,
            tools_b,
            sandbox,
            agents_a,
            agents_b,
            settings,
            workdir,
            workers=[],
        )
        # run_bash without its own network namespace: the sandbox host's rule alone must hold.
        sandboxed = settings.model_copy(
            update={"sandbox": settings.sandbox.model_copy(update={"isolation": "process"})}
        )
        expected = []
        for host, pool, node, pool_settings in (
            (tools_a, "tools", "toolsA", settings),
            (tools_b, "tools", "toolsB", settings),
            (sandbox, "sandbox", "sandbox", sandboxed),
        ):
            cluster.workers.append(
                network.start(
                    host,
                    f"worker-{node}",
                    worker_argv(pool, node),
                    env=cluster.environment(pool_settings),
                    uts=True,
                )
            )
            expected.append(keys.worker_heartbeat(pool, f"{node}@{host.hostname}"))
        # The agents hosts ask the model on the orchestrator host, with a key of their own.
        model = {
            "OPENAI_BASE_URL": f"http://{orchestrator.address}:{MODEL_PORT}/v1",
            "OPENAI_API_KEY": "agents-host-key",
            "TOOLQ_AGENT_CONCURRENCY": "8",
        }
        for host, node in ((agents_a, "agentsA"), (agents_b, "agentsB")):
            cluster.workers.append(
                network.start(
                    host,
                    f"worker-{node}",
                    worker_argv(AGENTS_QUEUE, node),
                    env=cluster.environment(**model),
                    uts=True,
                )
            )
            expected.append(keys.worker_heartbeat(AGENTS_QUEUE, f"{node}@{host.hostname}"))
        wait_for(
            lambda: _announced(cluster, expected), START_BOUND_S, "workers on every host to start"
        )
        yield cluster


def redis_argv(broker: Host, workdir: Path) -> list[str]:
    """The broker on its host's address only, keeping nothing on disk."""
    options = {
        "port": str(BROKER_PORT),
        "bind": broker.address,
        "protected-mode": "no",
        "save": "",
        "appendonly": "no",
        "dir": str(workdir),
    }
    return [
        redis_server_binary(),
        *(arg for name, value in options.items() for arg in (f"--{name}", value)),
    ]


def worker_argv(pool: str, node: str) -> list[str]:
    """A worker named after its node; ``%h`` is the host's own name (see Network.start). An
    agents worker's concurrency is TOOLQ_AGENT_CONCURRENCY's."""
    app = "api.agents.app" if pool == AGENTS_QUEUE else "worker.app"
    celery = [sys.executable, "-m", "celery", "-A", app, "worker"]
    return [
        *celery,
        "-Q",
        pool,
        "-n",
        f"{node}@%h",
        *(() if pool == AGENTS_QUEUE else ("-c", "2")),
        "--loglevel",
        "INFO",
        "--without-gossip",
        "--without-mingle",
    ]


def _announced(cluster: Cluster, heartbeat_keys: list[str]) -> bool:
    """Every worker's heartbeat is in the broker, as the orchestrator host sees it."""
    for worker in cluster.workers:
        if worker.process.poll() is not None:
            raise AssertionError(f"{worker.label} exited:\n{worker.log_tail()}")
    done = cluster.orchestrator.run(
        sys.executable, "-c", _HEARTBEATS, cluster.settings.redis_url, *heartbeat_keys
    )
    return done.returncode == 0


@dataclass
class ScriptedModel:
    host: Host

    def requests(self) -> int:
        done = self.host.run(sys.executable, "-c", _STATS, str(MODEL_PORT))
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)["requests"])


@contextlib.contextmanager
def scripted_model(cluster: Cluster, steps: list[dict[str, Any]]) -> Iterator[ScriptedModel]:
    """The scripted model in the orchestrator host; on all its addresses, so that other hosts
    could reach it unless their rules say otherwise."""
    script = cluster.workdir / f"script-{time.monotonic_ns()}.json"
    script.write_text(json.dumps({"steps": steps}))
    server = cluster.network.start(
        cluster.orchestrator,
        "scripted-model",
        [
            sys.executable,
            *f"-m api.cli scripted-llm --host 0.0.0.0 --port {MODEL_PORT}".split(),
            "--script",
            str(script),
        ],
        env=cluster.environment(),
    )
    try:
        failure = cluster.orchestrator.connect_error("127.0.0.1", MODEL_PORT, patience_s=30)
        assert failure is None, f"scripted model did not start: {failure}\n{server.log_tail()}"
        yield ScriptedModel(cluster.orchestrator)
    finally:
        cluster.network.stop(server)


@dataclass
class Batch:
    """``toolq batch`` running in the orchestrator host."""

    started: Started
    output: Path

    def records(self) -> list[dict[str, Any]]:
        """The results written so far: the batch may be appending one as they are read."""
        return finished_records(self.output)

    def wait(self) -> int:
        try:
            return self.started.process.wait(timeout=BATCH_BOUND_S)
        except subprocess.TimeoutExpired as exc:
            raise AssertionError(f"toolq batch still running:\n{self.started.log_tail()}") from exc


def start_batch(
    cluster: Cluster, name: str, items: list[dict[str, Any]], *, on_fleet: bool = False
) -> Batch:
    """``toolq batch`` on the orchestrator host; ``on_fleet``: the agents hosts run the
    conversations, and the orchestrator holds no model key at all."""
    source = cluster.workdir / f"{name}.jsonl"
    source.write_text("".join(json.dumps(item) + "\n" for item in items))
    output = cluster.workdir / f"{name}.out.jsonl"
    argv = [str(TOOLQ), "batch", str(source), "-o", str(output), "--concurrency", "8"]
    argv += ["--model", "scripted"]
    model = {"OPENAI_BASE_URL": f"http://127.0.0.1:{MODEL_PORT}/v1", "OPENAI_API_KEY": "test"}
    env = cluster.environment() if on_fleet else cluster.environment(**model)
    started = cluster.network.start(
        cluster.orchestrator,
        f"batch-{name}",
        [*argv, "--on-fleet"] if on_fleet else argv,
        env=env,
    )
    return Batch(started, output)


def host_of(call: dict[str, Any]) -> str | None:
    """The host name in a result's ``worker`` field (``hostname:pid``)."""
    worker = call.get("worker")
    return worker.rsplit(":", 1)[0] if worker else None


def runs_of(cluster: Cluster, record: dict[str, Any], marker: str) -> int:
    """How many times a conversation's slow_write call with ``marker`` started, on any host."""
    runs = Path(cluster.settings.workspace_root) / record["run_id"] / f"{marker}.runs"
    return len(runs.read_text().splitlines()) if runs.exists() else 0


def conversations(seconds: float) -> list[dict[str, Any]]:
    return [{"id": f"c{n:03}", "prompt": str(seconds)} for n in range(CONVERSATIONS)]


def two_call_batch(
    cluster: Cluster, name: str, *, on_fleet: bool = False
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A batch of conversations that make TWO_CALLS each, run to its end: its records and their
    tool calls, once every conversation is found ok, every call run once without error and the
    model asked three times a conversation."""
    with scripted_model(cluster, TWO_CALLS) as model:
        batch = start_batch(cluster, name, conversations(seconds=0.05), on_fleet=on_fleet)
        code = batch.wait()  # bound: BATCH_BOUND_S, in Batch.wait
        requests = model.requests()
    records = batch.records()
    assert code == 0, f"{batch.started.log_tail()}\n{cluster.logs()}"
    assert sorted(r["id"] for r in records) == [f"c{n:03}" for n in range(CONVERSATIONS)]
    assert {r["status"] for r in records} == {"ok"}
    calls = [call for r in records for call in r["tool_calls"]]
    assert len(calls) == 2 * CONVERSATIONS
    assert not [c for c in calls if c["is_error"]]
    assert {runs_of(cluster, r, m) for r in records for m in MARKERS} == {1}
    assert requests == 3 * CONVERSATIONS
    return records, calls


def test_a_batch_spreads_over_both_tools_hosts(cluster: Cluster) -> None:
    _, calls = two_call_batch(cluster, "spread")
    assert Counter(host_of(c) for c in calls).keys() == {
        cluster.tools_a.hostname,
        cluster.tools_b.hostname,
    }


def host_of_record(record: dict[str, Any]) -> str:
    """The host that ran a conversation, from its ``orchestrator`` field (``hostname:pid``)."""
    return str(record["orchestrator"]).rsplit(":", 1)[0]


def test_a_batch_on_the_fleet_spreads_over_both_agents_hosts(cluster: Cluster) -> None:
    records, calls = two_call_batch(cluster, "agents", on_fleet=True)
    assert {r["attempts"] for r in records} == {1}
    assert Counter(host_of_record(r) for r in records).keys() == {
        cluster.agents_a.hostname,
        cluster.agents_b.hostname,
    }
    assert {host_of(c) for c in calls} <= {cluster.tools_a.hostname, cluster.tools_b.hostname}


def test_the_sandbox_host_reaches_the_broker_and_nothing_else(cluster: Cluster) -> None:
    broker, orchestrator, sandbox = cluster.broker, cluster.orchestrator, cluster.sandbox
    targets = {
        "broker": (broker.address, BROKER_PORT),
        "orchestrator": (orchestrator.address, MODEL_PORT),
        "tools-host": (cluster.tools_a.address, BROKER_PORT),
    }
    script: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "run_bash", "arguments": {"command": "{prompt}"}}]},
        {"content": "done"},
    ]
    with scripted_model(cluster, script):
        # The same port that a tools host reaches is out of the sandbox host's reach.
        assert cluster.tools_a.connect_error(orchestrator.address, MODEL_PORT) is None
        assert sandbox.connect_error(broker.address, BROKER_PORT) is None
        for name in ("orchestrator", "tools-host"):
            failure = sandbox.connect_error(*targets[name])
            assert failure is not None
            assert "Network is unreachable" in failure
        batch = start_batch(
            cluster,
            "sandbox",
            [
                {
                    "id": name,
                    "prompt": f"bash -c 'exec 3<>/dev/tcp/{address}/{port} && echo connected'",
                    "enable": ["run_bash"],
                }
                for name, (address, port) in targets.items()
            ],
        )
        code = batch.wait()  # bound: BATCH_BOUND_S, in Batch.wait
    assert code == 0, f"{batch.started.log_tail()}\n{cluster.logs()}"
    answers = {}
    for record in batch.records():
        (call,) = record["tool_calls"]
        assert host_of(call) == sandbox.hostname
        answers[record["id"]] = json.loads(call["output"])
    assert answers["broker"]["exit_code"] == 0
    assert answers["broker"]["stdout"].strip() == "connected"
    for name in ("orchestrator", "tools-host"):
        assert answers[name]["exit_code"] != 0
        assert "Network is unreachable" in answers[name]["stderr"]
        # The host's rule stopped it, not a network namespace of the sandbox's own.
        assert "network-namespace" not in answers[name]["isolation"]


@dataclass
class CutBatch:
    """A batch during which a host's cable was pulled, as it ended."""

    batch: Batch
    code: int
    cut_at: int
    requests: int
    lines: list[str]
    records: list[dict[str, Any]]
    #: Starts of each conversation's slow_write calls, by (id, marker).
    runs: dict[tuple[str, str], int]


def cut_mid_batch(cluster: Cluster, host: Host, name: str, *, on_fleet: bool = False) -> CutBatch:
    """Pull ``host``'s cable once a quarter of a batch is done; plug it back in at the end."""
    with scripted_model(cluster, TWO_CALLS) as model:
        batch = start_batch(cluster, name, conversations(seconds=0.3), on_fleet=on_fleet)
        try:
            wait_for(
                lambda: len(batch.records()) >= CONVERSATIONS // 4,
                BATCH_BOUND_S,
                "a quarter of the batch to finish",
            )
            host.cut()
            cut_at = len(batch.records())
            code = batch.wait()  # bound: BATCH_BOUND_S, in Batch.wait
            requests = model.requests()
            records = batch.records()
            # Counted before the cable goes back in, while the host can still do nothing.
            runs = {(r["id"], m): runs_of(cluster, r, m) for r in records for m in MARKERS}
        finally:
            host.reconnect()
    lines = batch.output.read_text().splitlines()
    return CutBatch(batch, code, cut_at, requests, lines, records, runs)


def test_an_agents_host_cut_off_mid_batch_loses_and_writes_nothing_twice(cluster: Cluster) -> None:
    """Cuts agents host A off, and plugs it back in at the end: the batches after it run in
    this process, so whether its worker recovers does not matter to them."""
    agents_a, agents_b = cluster.agents_a, cluster.agents_b
    cut = cut_mid_batch(cluster, agents_a, "cut-agents", on_fleet=True)
    batch, records, runs = cut.batch, cut.records, cut.runs
    assert cut.code == 0, f"{batch.started.log_tail()}\n{cluster.logs()}"
    # Every conversation exactly once, each line whole, none lost with the cut host.
    assert len(cut.lines) == CONVERSATIONS
    assert sorted(r["id"] for r in records) == [f"c{n:03}" for n in range(CONVERSATIONS)]
    assert {r["status"] for r in records} == {"ok"}
    rerun = [r for r in records if r["attempts"] > 1]
    assert rerun, "the cut hit no conversation in flight"
    # What host A held ran again from the start on host B, in the same workspace.
    assert {host_of_record(r) for r in rerun} == {agents_b.hostname}
    assert {r["attempts"] for r in rerun} == {2}
    assert {host_of_record(r) for r in records} == {agents_a.hostname, agents_b.hostname}
    for record in records:
        for marker in MARKERS:
            started = runs[record["id"], marker]
            # A call with effects ran once per run of its conversation, at most.
            assert 1 <= started <= record["attempts"], (record["id"], marker, started)
    print(
        f"\ncut agents host A after {cut.cut_at} of {CONVERSATIONS} conversations; run again on "
        f"host B: {len(rerun)} ({', '.join(r['id'] for r in rerun)}); the batch said:\n"
        + "\n".join(line for line in batch.started.log_tail(200).splitlines() if "again" in line)
    )


def test_a_tools_host_cut_off_mid_batch_loses_and_repeats_nothing(cluster: Cluster) -> None:
    """Runs last: it cuts tools host A off and only plugs it back in at the end."""
    tools_a, tools_b = cluster.tools_a, cluster.tools_b
    cut = cut_mid_batch(cluster, tools_a, "cut")
    code, cut_at, requests, records, runs = (
        cut.code,
        cut.cut_at,
        cut.requests,
        cut.records,
        cut.runs,
    )
    batch = cut.batch
    assert code == 0, f"{batch.started.log_tail()}\n{cluster.logs()}"
    # Every conversation exactly once, and each asked the model its three questions once.
    assert sorted(r["id"] for r in records) == [f"c{n:03}" for n in range(CONVERSATIONS)]
    assert {r["status"] for r in records} == {"ok"}
    assert requests == 3 * CONVERSATIONS
    calls = [call for r in records for call in r["tool_calls"]]
    assert len(calls) == 2 * CONVERSATIONS
    answered = Counter(host_of(c) for c in calls if not c["is_error"])
    lost = [c for c in calls if c["is_error"]]
    assert answered.keys() == {tools_a.hostname, tools_b.hostname}
    # Calls the cut host held when its cable was pulled: reported, not silently dropped; one it
    # had started may have run, one it never started did not.
    assert lost, "the cut hit no call in flight"
    assert {c["error_kind"] for c in lost} <= {"no_answer", "interrupted"}
    said = ("Error: no answer for slow_write", "Error: slow_write was interrupted")
    assert all(c["output"].startswith(said) for c in lost)
    # A call with effects ran at most once, exactly once when it was answered, and never when
    # it was said never to have started.
    for record in records:
        for marker, call in zip(MARKERS, record["tool_calls"], strict=True):
            started = runs[record["id"], marker]
            if call["error_kind"] == "no_answer":
                assert started == 0, (record["id"], call)
            assert started <= 1 if call["is_error"] else started == 1, (record["id"], call)
    print(
        f"\ncut tools host A after {cut_at} of {CONVERSATIONS} conversations; calls answered: "
        f"{dict(answered)}; answered with an error: {len(lost)}: "
        + "; ".join(c["output"] for c in lost)
    )
