"""The agents workers' Celery app: what its configuration promises."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from api.agents.app import agents_config, create_agents_app
from api.agents.messages import CONVERSATION_TASK
from api.calls.broker import producer_config
from api.local.stack import worker_argv
from api.settings import OrchestratorSettings
from worker.app import celery_config
from worker.contract.keys import AGENTS_UNACKED_HASH, UNACKED_HASH
from worker.contract.settings import WorkerSettings
from worker.contract.wire import AGENTS_QUEUE, POOLS


def settings(**values: object) -> OrchestratorSettings:
    return OrchestratorSettings(**({"broker_url": "redis://127.0.0.1:1/0"} | values))  # type: ignore[arg-type]


def test_conversations_are_acknowledged_late_many_to_a_thread_pool() -> None:
    config = agents_config(settings(agent_concurrency=37))
    assert config["task_acks_late"] is True
    assert config["worker_pool"] == "threads"
    assert config["worker_concurrency"] == 37
    assert config["worker_prefetch_multiplier"] == 1
    assert [queue.name for queue in config["task_queues"]] == ["agents"]
    assert config["accept_content"] == ["json"]


def test_every_app_declares_a_queue_it_shares_the_same_way() -> None:
    """A RabbitMQ queue declared twice must match: the orchestrator's producer, the tool pools'
    workers and the agents workers declare each queue they share alike."""
    declared: dict[str, list[object]] = {}
    for config in (
        producer_config(settings()),
        celery_config(WorkerSettings(broker_url="redis://127.0.0.1:1/0")),
        agents_config(settings()),
    ):
        for queue in config["task_queues"]:
            declared.setdefault(queue.name, []).append(queue)
    assert sorted(declared) == sorted({*POOLS, AGENTS_QUEUE})
    # Each is declared by the producer and by the workers that serve it.
    assert all(len(queues) == 2 for queues in declared.values())
    assert all(queue == queues[0] for queues in declared.values() for queue in queues)


def test_the_visibility_timeout_outlasts_a_conversation_and_is_kept_apart() -> None:
    options = agents_config(settings(conversation_timeout_s=900))["broker_transport_options"]
    assert options["visibility_timeout"] > 900
    assert options["unacked_key"] == AGENTS_UNACKED_HASH != UNACKED_HASH
    assert {options["unacked_index_key"], options["unacked_mutex_key"]}.isdisjoint(
        {"unacked_index", "unacked_mutex"}
    )
    # The tool pools' timeout is much shorter: sharing their hash would requeue conversations.
    tools = celery_config(WorkerSettings(broker_url="redis://127.0.0.1:1/0"))
    assert "unacked_key" not in tools["broker_transport_options"]


def test_an_amqp_broker_needs_no_transport_options() -> None:
    config = agents_config(
        settings(broker_url="amqp://guest@localhost//", result_backend="redis://h:1/0")
    )
    assert "broker_transport_options" not in config


def test_the_app_serves_the_conversation_task() -> None:
    app = create_agents_app(settings())
    app.loader.import_default_modules()
    assert CONVERSATION_TASK in app.tasks


def test_an_agents_worker_is_started_from_its_own_app() -> None:
    argv = worker_argv("agents", node="a@%h")
    assert argv[argv.index("-A") + 1] == "api.agents.app"
    assert argv[argv.index("-Q") + 1] == "agents"
    assert "--concurrency" not in argv  # TOOLQ_AGENT_CONCURRENCY decides
    tools = worker_argv("tools", node="t@%h", concurrency=2)
    assert tools[tools.index("-A") + 1] == "worker.app"


def test_an_agents_worker_without_a_model_stops_at_start_saying_why(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "TOOLQ_"))}
    env["TOOLQ_BROKER_URL"] = "redis://127.0.0.1:1/0"  # never reached: it stops before
    done = subprocess.run(
        worker_argv("agents", node="a@%h"),
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert "toolq agents worker: OPENAI_API_KEY is not set" in done.stderr
