"""Every Redis key, as a string: workers, callers and API replicas of other versions share them,
so none may change."""

from __future__ import annotations

from worker.contract import keys as k


def test_the_fleets_keys() -> None:
    assert k.keys.MANIFEST == "toolq:manifest"
    assert k.keys.result("t1") == "toolq:result:t1"
    assert k.keys.started("t1") == "toolq:started:t1"
    assert k.keys.reply("d1") == "toolq:reply:d1" and k.keys.is_reply("toolq:reply:d1")
    assert k.keys.worker_heartbeat("tools", "w@h") == "toolq:worker:tools:w@h"
    assert k.keys.worker_heartbeats("tools") == "toolq:worker:tools:*"


def test_the_agents_pools_keys() -> None:
    c = k.conversation_keys
    assert c.result("r1") == "toolq:conversation:r1:result"
    assert c.lease("r1") == "toolq:conversation:r1:lease"
    assert c.attempts("r1") == "toolq:conversation:r1:attempts"
    assert c.current("r1") == "toolq:conversation:r1:current"


def test_kombus_keys() -> None:
    assert k.UNACKED_HASH == "unacked"
    assert (k.AGENTS_UNACKED_HASH, k.AGENTS_UNACKED_INDEX, k.AGENTS_UNACKED_MUTEX) == (
        "toolq:agents:unacked",
        "toolq:agents:unacked_index",
        "toolq:agents:unacked_mutex",
    )
    assert k.queue_lists("tools") == ["tools", "tools\x06\x163", "tools\x06\x166", "tools\x06\x169"]


def test_the_http_apis_keys() -> None:
    assert k.CANCEL_CHANNEL == "toolq:api:cancel"
    assert (k.ACTIVE_RUNS, k.ACTIVE_BATCHES) == (
        "toolq:api:active:runs",
        "toolq:api:active:batches",
    )
    assert k.run_state_key("r") == "toolq:api:run:r"
    assert k.run_events_key("r") == "toolq:api:run:r:events"
    assert k.run_cancel_key("r") == "toolq:api:run:r:cancel"
    assert k.batch_state_key("b") == "toolq:api:batch:b"
    assert k.batch_results_key("b") == "toolq:api:batch:b:results"
    assert k.batch_summaries_key("b") == "toolq:api:batch:b:summaries"
    assert k.replica_lease_key("x") == "toolq:api:replica:x"
    # The default tenant's indexes are the ones of before tenants.
    assert k.runs_index_key(k.DEFAULT_TENANT) == "toolq:api:index:runs"
    assert k.runs_index_key("alice") == "toolq:api:index:runs:alice"
    assert k.batches_index_key(k.DEFAULT_TENANT) == "toolq:api:index:batches"
    assert k.batches_index_key("alice") == "toolq:api:index:batches:alice"


def test_inspects_keys() -> None:
    assert k.inspect_eval_key("e1") == "toolq:inspect:eval:e1"
    assert k.inspect_eval_key("e1").startswith(k.INSPECT_EVAL_PREFIX)
