"""Faults on real processes: worker children killed, Redis restarted, the orchestrator killed,
the model's API failing, a tool that will not stop. Nothing may be lost or run twice."""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.calls.dispatch import Dispatcher
from api.local.stack import worker_environment
from api.scripted.server import ScriptedServer
from tests.conftest import Caller, StartModel, WorkerFleet, wait_for
from tests.reliability.conftest import Stack, alive, ancestors, find_process, start_stack
from tests.reliability.report import Counts, Report
from tests.results_file import finished_lines, finished_records, finished_text
from worker.contract.settings import WorkerSettings
from worker.plumbing.heartbeat import HEARTBEAT_INTERVAL_S

pytestmark = pytest.mark.integration

TOOLQ = Path(sys.executable).parent / "toolq"
REPEATS = 5
BATCH_TIMEOUT_S = 120

#: One call with effects that leaves a mark each time it runs, then the answer.
MARKED_CALL: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "slow_write", "arguments": {"seconds": 0.1, "marker": "m"}}]},
    {"content": "done"},
]


@pytest.fixture(scope="module")
def kill_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """A fleet of its own: its worker children get killed."""
    stack = start_stack(tmp_path_factory.mktemp("kill"), hard_limit_grace_s=1.0)
    yield stack
    stack.stop()


# --- Worker children killed mid-call -------------------------------------------------------------


def _child_that_wrote(stack: Stack, runs: Path) -> int:
    wait_for(lambda: runs.exists() and runs.read_text().strip() != "", what="the call to start")
    pid = int(runs.read_text().split()[0])
    assert pid in stack.fleet.worker_pids("tools")[1:], "the pid is not a tools pool child"
    return pid


async def test_a_read_only_call_whose_worker_child_is_killed_is_redelivered_and_completes(
    kill_stack: Stack, report: Report
) -> None:
    with report.case(
        "Faults",
        f"Worker child SIGKILLed mid-call, read-only tool (slow_read), {REPEATS} times",
        "redelivered to another child and completed; the caller gets one answer",
    ) as row:
        results = []
        runs = []
        after_kill: list[float] = []
        async with Dispatcher(kill_stack.settings) as dispatcher:
            caller = Caller(dispatcher, kill_stack.settings, "run-kill-read")
            workspace = kill_stack.workspace_root / caller.run_id
            for n in range(REPEATS):
                marker = workspace / f"read-{n}.runs"
                pending = asyncio.ensure_future(
                    caller("slow_read", {"seconds": 1.0, "marker": f"read-{n}"})
                )
                victim = await asyncio.to_thread(_child_that_wrote, kill_stack, marker)
                os.kill(victim, signal.SIGKILL)
                killed_at = time.monotonic()
                results.append(await asyncio.wait_for(pending, 30))
                after_kill.append(time.monotonic() - killed_at)
                runs.append(marker.read_text().count("\n"))
        completed = sum(r.output == "slept 1.0s" for r in results)
        row.counts = Counts(
            sent=REPEATS,
            answered=sum(r.error_kind != "no_answer" for r in results),
            lost=sum(r.error_kind == "no_answer" for r in results),
            # The killed run and the completed one: anything more ran a finished call again.
            duplicated=sum(max(0, n - 2) for n in runs),
        )
        row.observed = (
            f"{completed}/{REPEATS} completed 'slept 1.0s', {min(after_kill):.1f} to "
            f"{max(after_kill):.1f} s after the kill (1 s of it the rerun); runs per call {runs}"
        )
        assert completed == REPEATS, [r.output for r in results]
        assert runs == [2] * REPEATS


def _sandbox_child_running(stack: Stack, argv: tuple[str, ...]) -> tuple[int, list[int]]:
    """The sandbox pool child running the command whose process is ``argv``, and the chain of
    processes from just below that child down to it."""
    found: list[int] = []

    def started() -> bool:
        found[:] = find_process(argv)
        return bool(found)

    wait_for(started, what=f"{' '.join(argv)} to start")
    chain = ancestors(found[0])
    children = stack.fleet.worker_pids("sandbox")[1:]
    position = next((i for i, pid in enumerate(chain) if pid in children), None)
    assert position is not None, f"no sandbox pool child above {' '.join(argv)}"
    return chain[position], chain[:position]


def _kill_namespace(below_child: list[int]) -> None:
    """End what a killed worker child left behind: its command's processes, by pid."""
    # Outermost first: unshare, then the namespace's first process, whose end ends the rest.
    for pid in reversed(below_child):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


async def test_a_run_bash_call_whose_worker_child_is_killed_is_answered_and_never_rerun(
    kill_stack: Stack, report: Report
) -> None:
    with report.case(
        "Faults",
        f"Worker child SIGKILLed mid-call, run_bash (`echo run >> ran.txt; sleep 5`), "
        f"{REPEATS} times",
        "answered 'interrupted, outcome unknown'; the command never runs a second time",
    ) as row:
        results = []
        runs = []
        leftovers: list[list[int]] = []
        try:
            async with Dispatcher(kill_stack.settings) as dispatcher:
                caller = Caller(dispatcher, kill_stack.settings, "run-kill-bash")
                workspace = kill_stack.workspace_root / caller.run_id
                for n in range(REPEATS):
                    seconds = f"5.0{n}"  # tells this call's sleep apart from the others
                    command = f"echo run >> ran-{n}.txt; sleep {seconds}"
                    pending = asyncio.ensure_future(caller("run_bash", {"command": command}))
                    child, below = await asyncio.to_thread(
                        _sandbox_child_running, kill_stack, ("sleep", seconds)
                    )
                    leftovers.append(below)
                    os.kill(child, signal.SIGKILL)
                    results.append(await asyncio.wait_for(pending, 30))
                    runs.append((workspace / f"ran-{n}.txt").read_text().count("\n"))
        finally:
            for below in leftovers:
                _kill_namespace(below)
        interrupted = sum(
            r.error_kind == "interrupted" and "outcome is unknown" in r.output for r in results
        )
        row.counts = Counts(
            sent=REPEATS,
            answered=sum(r.error_kind != "no_answer" for r in results),
            lost=sum(r.error_kind == "no_answer" for r in results),
            duplicated=sum(max(0, n - 1) for n in runs),
        )
        row.observed = f"{interrupted}/{REPEATS} answered 'interrupted'; runs per call {runs}"
        assert interrupted == REPEATS, [r.output for r in results]
        assert runs == [1] * REPEATS


async def test_the_command_of_a_killed_worker_child_does_not_outlive_it(
    kill_stack: Stack, report: Report
) -> None:
    with report.case(
        "Faults",
        "Worker child SIGKILLed mid-run_bash (`sleep 300`): the command it started",
        "killed with the child: nothing of it runs once the call is answered",
    ) as row:
        below: list[int] = []
        try:
            async with Dispatcher(kill_stack.settings) as dispatcher:
                caller = Caller(dispatcher, kill_stack.settings, "run-kill-orphan")
                pending = asyncio.ensure_future(caller("run_bash", {"command": "sleep 300.5"}))
                child, below = await asyncio.to_thread(
                    _sandbox_child_running, kill_stack, ("sleep", "300.5")
                )
                os.kill(child, signal.SIGKILL)
                result = await asyncio.wait_for(pending, 30)
            row.counts = Counts(sent=1, answered=int(result.error_kind != "no_answer"))
            assert result.error_kind == "interrupted", result.output
            # A namespace takes a moment to empty, longer on a busy machine; a bound, not a
            # pause, and far below the 300 s the command would run.
            with contextlib.suppress(AssertionError):
                await asyncio.to_thread(
                    wait_for, lambda: not any(alive(pid) for pid in below), 30.0, "the command"
                )
            left = [pid for pid in below if alive(pid)]
            row.observed = (
                f"answered 'interrupted'; {len(left)} of the {len(below)} processes of the "
                "command still running"
            )
            if left:
                row.open_gap = ORPHANED_COMMAND
            assert not left
        finally:
            _kill_namespace(below)


#: What it means when a killed worker child's command lives on.
ORPHANED_COMMAND = (
    "the command of a worker child killed mid-call ran on after the call was answered, with no "
    "time limit any more: worker/sandbox/plan.py must tie the command's wrapper (prlimit, "
    "unshare, setpriv, the shell) to the worker child with a parent-death signal at every step, "
    "and worker/sandbox/sweep.py must sweep the leftovers of dead children where there is no PID "
    "namespace."
)


async def test_a_tool_past_its_hard_limit_has_its_child_replaced_and_the_pool_serves_on(
    kill_stack: Stack, report: Report
) -> None:
    after_calls = 20
    with report.case(
        "Faults",
        "A tool past its hard limit (`stubborn` ignores its soft limit), on both children at once",
        "answered 'timeout'; the worker children are replaced; the next 20 calls all answer",
    ) as row:
        before = set(kill_stack.fleet.worker_pids("tools")[1:])
        async with Dispatcher(kill_stack.settings) as dispatcher:
            caller = Caller(dispatcher, kill_stack.settings, "run-stubborn")
            stopped = await asyncio.gather(
                *(caller("stubborn", {}, timeout_ms=300) for _ in range(2))
            )
            later = await asyncio.gather(*(caller("noop", {}) for _ in range(after_calls)))
        after = set(kill_stack.fleet.worker_pids("tools")[1:])
        timeouts = sum(r.error_kind == "timeout" and "hard time limit" in r.output for r in stopped)
        served = sum(r.output == "ok" for r in later)
        row.counts = Counts(
            sent=2 + after_calls,
            answered=timeouts + served,
            lost=sum(r.error_kind == "no_answer" for r in [*stopped, *later]),
        )
        row.observed = (
            f"{timeouts}/2 answered 'timeout … hard time limit'; {len(before - after)} children "
            f"replaced; {served}/{after_calls} later calls answered"
        )
        assert timeouts == 2, [r.output for r in stopped]
        assert served == after_calls
        assert before - after, "no worker child was replaced"


# --- The batch command under faults -------------------------------------------------------------


def batch_environment(
    settings: WorkerSettings, server: ScriptedServer, **extra: str
) -> dict[str, str]:
    return {
        **os.environ,
        **worker_environment(settings),
        "OPENAI_BASE_URL": server.base_url,
        "OPENAI_API_KEY": "test",
        "TOOLQ_LOG_LEVEL": "ERROR",
        **extra,
    }


def start_batch(
    source: Path, output: Path, env: dict[str, str], concurrency: int, log: Path
) -> subprocess.Popen[bytes]:
    argv = [str(TOOLQ), "batch", str(source), "-o", str(output)]
    argv += ["--concurrency", str(concurrency), "--model", "scripted"]
    with log.open("ab") as stderr:
        return subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=stderr)


def write_items(path: Path, items: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(item) + "\n" for item in items))
    return path


def lines_in(output: Path) -> int:
    return len(finished_lines(output))


def id_counts(output: Path) -> collections.Counter[str]:
    return collections.Counter(r["id"] for r in finished_records(output))


#: A call with effects and one safe to repeat, each leaving a mark in the run's workspace
#: every time it runs, then the answer.
MARKED_CALLS: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "slow_write", "arguments": {"seconds": 0.05, "marker": "w"}}]},
    {"tool_calls": [{"name": "slow_read", "arguments": {"seconds": 0.05, "marker": "r"}}]},
    {"content": "done"},
]
MARKER_OF = {"slow_write": "w", "slow_read": "r"}


async def test_a_redis_restart_mid_batch_loses_no_call_and_runs_none_twice(
    tmp_path: Path, start_model: StartModel, report: Report
) -> None:
    total, outage_s = 200, 1.0
    with report.case(
        "Faults",
        f"Redis (append-only, as deployed) restarted, {outage_s:g} s down, mid-batch of {total} "
        "conversations (`toolq batch`, concurrency 50; each makes a call with effects and one "
        "safe to repeat)",
        "the batch finishes, every id exactly once; 0 false `no_answer` (a call that started "
        "is answered 'interrupted, outcome unknown'), 0 calls never started lost (sent again), "
        "0 calls with effects run twice",
    ) as row:
        stack = start_stack(
            tmp_path / "stack",
            redis_appendonly=True,
            default_timeout_ms=4_000,
            max_timeout_ms=8_000,
            hard_limit_grace_s=1.0,
            reply_margin_s=5.0,
            resend_after_s=1.0,
        )
        try:
            server = start_model(MARKED_CALLS)
            ids = [f"conv-{n}" for n in range(total)]
            source = write_items(tmp_path / "in.jsonl", [{"id": i, "prompt": i} for i in ids])
            output = tmp_path / "out.jsonl"
            log = tmp_path / "batch.log"
            batch = start_batch(source, output, batch_environment(stack.settings, server), 50, log)
            try:
                wait_for(lambda: lines_in(output) >= total // 4, 60, "a quarter of the batch")
                at_restart = lines_in(output)
                stack.redis.stop(graceful=True)
                time.sleep(outage_s)  # the outage itself, not a wait for something
                stack.redis.start()
                code = batch.wait(timeout=BATCH_TIMEOUT_S)
            finally:
                if batch.poll() is None:
                    batch.kill()
                    batch.wait(timeout=30)
            worker_deaths = _dead_workers(stack)
        finally:
            stack.stop()
        counts = id_counts(output)
        results = finished_records(output)
        errors = [r for r in results if r["status"] != "ok"]
        calls = [(r, c) for r in results for c in r["tool_calls"]]
        kinds = collections.Counter(c["error_kind"] or "ok" for _, c in calls)
        root = stack.workspace_root

        def runs(record: dict[str, Any], call: dict[str, Any]) -> int:
            marks = root / record["run_id"] / f"{MARKER_OF[call['name']]}.runs"
            return marks.read_text().count("\n") if marks.exists() else 0

        unanswered = [(r, c) for r, c in calls if c["error_kind"] == "no_answer"]
        false_no_answer = sum(runs(r, c) > 0 for r, c in unanswered)
        never_started_lost = (
            sum(runs(r, c) == 0 for r, c in unanswered) + kinds["broker_unavailable"]
        )
        effectful_twice = sum(runs(r, c) > 1 for r, c in calls if c["name"] == "slow_write")
        row.counts = Counts(
            sent=len(calls),
            answered=len(calls) - len(unanswered) - kinds["broker_unavailable"],
            lost=never_started_lost,
            duplicated=effectful_twice + sum(n - 1 for n in counts.values()),
        )
        row.observed = (
            f"restart after {at_restart} results; exit {code}; {len(counts)}/{total} "
            f"conversations, {total - len(errors)} ok, {len(errors)} error; tool calls: "
            + ", ".join(f"{n} {kind}" for kind, n in kinds.most_common())
            + f"; false no_answer {false_no_answer}, never started and lost "
            f"{never_started_lost}, with effects run twice {effectful_twice}" + _examples(results)
        )
        report.gap(
            "A crash of Redis can lose its last second of writes",
            "with `appendfsync everysec` (Redis' default, and the deploy's), a Redis killed "
            "outright (not restarted: a restart writes its append-only file out first, as in "
            "the test above) loses up to a second of writes: queued calls, which the caller "
            "sends again, but also start markers, so a call with effects that had started may "
            "run a second time. `appendfsync always` keeps every acknowledged write.",
        )
        assert code in (0, 1), log.read_text()[-2000:]
        assert set(counts) == set(ids) and set(counts.values()) == {1}
        assert all(r["error"] for r in errors)
        assert kinds["ok"] > 0
        assert false_no_answer == 0
        assert effectful_twice == 0
        # A worker that exited (the kombu race below) leaves its pool's calls unstarted.
        if not worker_deaths:
            assert never_started_lost == 0
    blamed = sum(
        "no worker is serving" in c["output"] and "restarted" not in c["output"]
        for r in results
        for c in r["tool_calls"]
    )
    if blamed and not worker_deaths:
        report.gap(
            "After a Redis restart, `no_answer` blames workers that are there",
            "api/calls/call_watch.py `_not_started_why` says 'no worker is serving the … queue' "
            "when it finds no heartbeat key, but a restarted Redis has none until each worker's "
            f"next heartbeat (worker/manifest.py, every {HEARTBEAT_INTERVAL_S:g} s): {blamed} "
            "calls in the restart test were told so while both workers were alive. Saying 'no "
            "worker has announced itself since the store restarted (or none is serving)' when the "
            "store's uptime is shorter than the heartbeat TTL would not mislead.",
        )
    # Measured here, asserted in test_deaf_workers.py: a worker serves on, or exits to be
    # started again.
    with report.case(
        "Faults",
        "The workers through that Redis restart",
        "reconnect and serve on",
    ) as row:
        row.observed = (
            "; ".join(worker_deaths) or "both worker processes still running after the batch"
        )
        if worker_deaths:
            row.passed = False
            row.open_gap = f"{KOMBU_RESTART_RACE} In this run: {row.observed}."


KOMBU_RESTART_RACE = (
    "A worker stopped by a Redis restart, for a reason not known yet (its log says which). "
    "The one known, kombu's Redis channel handing unacknowledged messages back through a "
    "connection already closed (`AttributeError: 'NoneType' object has no attribute "
    "'hostname'`, Celery 5.7.0, kombu 5.7.0), is a connection error in toolq's transport "
    "(worker/plumbing/redis_transport.py), which Celery recovers from. A worker whose "
    "consumer stops for good withdraws its heartbeat and exits non-zero "
    "(worker/plumbing/lifeline.py), and is started again "
    "by deploy/compose.yaml (`restart: unless-stopped`), Kubernetes or the local stack; until "
    "then calls to its pool wait for another worker or are answered `no_answer`."
)


def _dead_workers(stack: Stack) -> list[str]:
    """Pools whose worker process has exited, with the reason from its log."""
    dead = []
    for pool in ("tools", "sandbox"):
        if alive(stack.fleet.worker_pids(pool)[0]):
            continue
        # The whole log: the tracebacks after the fatal line push it out of the usual tail.
        log = stack.fleet.log(pool, 100_000)
        reason = next(
            (line.split("] ", 1)[-1] for line in log.splitlines() if "Unrecoverable error" in line),
            "no reason in its log",
        )
        dead.append(f"the {pool} worker exited: {reason[:140]}")
    return dead


def _examples(results: list[dict[str, Any]]) -> str:
    """The most common failed tool call of each kind, as the model saw it."""
    seen: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for result in results:
        for call in result["tool_calls"]:
            if call["error_kind"]:
                seen[call["error_kind"]][f"{call['name']}: {call['output'][:90]}"] += 1
    return "".join(
        f"; e.g. {kind} '{examples.most_common(1)[0][0]}…'" for kind, examples in seen.items()
    )


async def test_a_killed_orchestrator_resumes_without_rerunning_finished_conversations(
    fleet: WorkerFleet, tmp_path: Path, start_model: StartModel, report: Report
) -> None:
    total = 60
    with report.case(
        "Faults",
        f"The orchestrator (`toolq batch`, {total} conversations) SIGKILLed mid-batch, then "
        "started again",
        "finished conversations are not asked of the model again nor their tools rerun; "
        "every id exactly once; one cut by the kill runs again in a new workspace, so no call "
        "with effects runs twice in one",
    ) as row:
        server = start_model(MARKED_CALL)
        ids = [f"job-{n}" for n in range(total)]
        source = write_items(tmp_path / "in.jsonl", [{"id": i, "prompt": "go"} for i in ids])
        output = tmp_path / "out.jsonl"
        env = batch_environment(fleet.settings, server)
        log = tmp_path / "batch.log"
        killed = start_batch(source, output, env, 6, log)
        try:
            wait_for(lambda: lines_in(output) >= total // 3, 60, "a third of the batch")
        finally:
            killed.send_signal(signal.SIGKILL)
            killed.wait(timeout=10)
        finished_before = finished_text(output)
        done_before = {r["id"]: r for r in finished_records(output)}
        runs_before = _marks(fleet, done_before.values())
        requests_before = server.stats()["requests"]

        resumed = start_batch(source, output, env, 6, log)
        code = resumed.wait(timeout=BATCH_TIMEOUT_S)

        counts = id_counts(output)
        results = {r["id"]: r for r in finished_records(output)}
        runs_after = _marks(fleet, results.values())
        asked_again = server.stats()["requests"] - requests_before
        remaining = total - len(done_before)
        cut_by_kill = [r for r in results.values() if r["attempts"] > 1]
        set_aside = _marks_in(fleet, [w for r in cut_by_kill for w in r["earlier_run_ids"]])
        # Each workspace, final or set aside, where the marked call ran more than once.
        twice = sum(n > 1 for n in [*runs_after.values(), *set_aside.values()])
        row.counts = Counts(
            sent=total,
            answered=len(counts),
            lost=len(set(ids) - set(counts)),
            duplicated=sum(n - 1 for n in counts.values())
            + sum(runs_after[i] != runs_before[i] for i in done_before)
            + twice,
        )
        marked_aside = sum(n > 0 for n in set_aside.values())
        row.observed = (
            f"killed after {len(done_before)} finished; the rerun made {asked_again} model "
            f"requests for the {remaining} left (2 each expected); {len(cut_by_kill)} "
            "conversations cut by the kill ran again from the start, each in a new workspace "
            f"(attempts 2, the earlier one named; {marked_aside} of those held the cut "
            f"attempt's call); effectful calls run twice in one workspace: {twice}"
        )
        if cut_by_kill:
            report.gap(
                "A conversation cut by a kill of the orchestrator is redone from the start",
                "its next attempt works in a workspace of its own (docs/reference/batch.md, "
                "'Resuming'), so nothing runs twice in one workspace; but the cut attempt's "
                "model requests are made again, and a tool call whose effect reaches beyond the "
                "workspace (a "
                f"network request, say) runs again ({len(cut_by_kill)} of {total} in the kill "
                "test). Keeping each conversation's finished tool results (by run_id and step) "
                "would let a resume skip them.",
            )
        assert code == 0, log.read_text()[-2000:]
        assert output.read_text().startswith(finished_before)
        assert set(counts) == set(ids) and set(counts.values()) == {1}
        assert all(r["status"] == "ok" for r in results.values())
        assert asked_again == 2 * remaining
        assert {i: runs_after[i] for i in done_before} == runs_before
        assert twice == 0
        for record in cut_by_kill:
            assert record["attempts"] == 2
            assert record["earlier_run_ids"] == [record["run_id"].removesuffix("-a2")]


def _marks(fleet: WorkerFleet, results: Any) -> dict[str, int]:
    """How often each conversation's marked tool call ran, from the marks in its workspace."""
    marks = _marks_in(fleet, [result["run_id"] for result in results])
    return {result["id"]: marks[result["run_id"]] for result in results}


def _marks_in(fleet: WorkerFleet, run_ids: list[str]) -> dict[str, int]:
    """How often the marked tool call ran in each of these workspaces."""
    root = Path(fleet.settings.workspace_root)
    marks = {}
    for run_id in run_ids:
        runs = root / run_id / "m.runs"
        marks[run_id] = runs.read_text().count("\n") if runs.exists() else 0
    return marks


# --- The model's API failing ---------------------------------------------------------------------

LLM_TIMEOUT_S = 2
LLM_RETRIES = 2
ATTEMPTS = LLM_RETRIES + 1
PER_SCRIPT = 3


def _faulty(fault: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A model whose first turn fails as ``fault`` says, then calls a tool, then answers."""
    first: dict[str, Any] = {"tool_calls": [{"name": "noop", "arguments": {}}]}
    if fault is not None:
        first["fault"] = fault
    return [first, {"content": "fine"}]


#: name: (fault, what should happen, model requests per conversation, should end ok).
MODEL_FAULTS: dict[str, tuple[dict[str, Any] | None, str, int, bool]] = {
    "healthy": (None, "ok, next to the failing ones", 2, True),
    "http500": (
        {"kind": "status", "status": 500, "times": 2},
        "HTTP 500 twice: retried, then ok",
        ATTEMPTS + 1,
        True,
    ),
    "ratelimit": (
        {"kind": "status", "status": 429, "retry_after": 1, "times": 2},
        "429 with Retry-After: 1 twice: waits as asked, then ok",
        ATTEMPTS + 1,
        True,
    ),
    "garbage": (
        {"kind": "garbage", "times": 2},
        "a body that is not JSON twice: retried, then ok",
        ATTEMPTS + 1,
        True,
    ),
    "cut": (
        {"kind": "cut", "times": 2},
        "the answer cut off mid-body twice: retried, then ok",
        ATTEMPTS + 1,
        True,
    ),
    "stall": (
        {"kind": "stall", "seconds": 30, "times": 1},
        f"a 30 s stall once: timed out after {LLM_TIMEOUT_S} s, retried, then ok",
        3,
        True,
    ),
    "down": (
        {"kind": "status", "status": 500, "times": 9},
        f"HTTP 500 past the retries: error 'failed after {ATTEMPTS} attempts'",
        ATTEMPTS,
        False,
    ),
    "stalled": (
        {"kind": "stall", "seconds": 30, "times": 9},
        f"30 s stalls past the retries: error 'failed after {ATTEMPTS} attempts … timed out'",
        ATTEMPTS,
        False,
    ),
    "refused": (
        {"kind": "status", "status": 400, "times": 9},
        "HTTP 400: error 'refused, not retried' after one request",
        1,
        False,
    ),
}


async def test_model_api_failures_are_retried_then_reported_per_conversation(
    fleet: WorkerFleet, tmp_path: Path, start_model: StartModel, report: Report
) -> None:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    for name, (fault, _, _, _) in MODEL_FAULTS.items():
        (scripts / f"{name}.json").write_text(json.dumps({"steps": _faulty(fault)}))
    server = start_model([{"content": "unused"}], scripts)
    items = [
        {"id": f"{name}-{n}", "prompt": f"{name} {n}", "model": f"scripted:{name}"}
        for name in MODEL_FAULTS
        for n in range(PER_SCRIPT)
    ]
    source = write_items(tmp_path / "in.jsonl", items)
    output = tmp_path / "out.jsonl"
    env = batch_environment(
        fleet.settings,
        server,
        TOOLQ_LLM_TIMEOUT_S=str(LLM_TIMEOUT_S),
        TOOLQ_LLM_MAX_RETRIES=str(LLM_RETRIES),
    )
    log = tmp_path / "batch.log"
    code = start_batch(source, output, env, len(items), log).wait(timeout=BATCH_TIMEOUT_S)
    results = {r["id"]: r for r in finished_records(output)}
    requests = server.stats()["requests"]

    failures = []
    for name, (fault, expected, _, ends_ok) in MODEL_FAULTS.items():
        mine = [results[i] for i in (f"{name}-{n}" for n in range(PER_SCRIPT)) if i in results]
        case = "The model's API: " + (name if fault is None else _describe_fault(fault))
        try:
            with report.case("Faults", case, expected) as row:
                row.counts = Counts(
                    sent=PER_SCRIPT,
                    answered=len(mine),
                    lost=PER_SCRIPT - len(mine),
                )
                row.observed = _describe_outcomes(mine)
                assert len(mine) == PER_SCRIPT
                if ends_ok:
                    assert all(r["status"] == "ok" and r["answer"] == "fine" for r in mine)
                    assert all(c["output"] == "ok" for r in mine for c in r["tool_calls"])
                else:
                    assert all(r["status"] == "error" for r in mine)
                    assert all(_clear_model_error(name, r["error"]) for r in mine), mine[0]
                if name == "ratelimit":
                    assert all(r["duration_s"] >= 2.0 for r in mine)
        except AssertionError as exc:
            failures.append(f"{name}: {exc}")
    expected_requests = PER_SCRIPT * sum(n for _, _, n, _ in MODEL_FAULTS.values())
    assert code == 1, log.read_text()[-2000:]  # the conversations that failed for good
    assert not failures, failures
    assert requests == expected_requests, (requests, expected_requests)


def _describe_fault(fault: dict[str, Any]) -> str:
    kind = fault["kind"]
    times = fault["times"]
    if kind == "status":
        extra = f", Retry-After {fault['retry_after']} s" if "retry_after" in fault else ""
        what = f"HTTP {fault['status']}{extra}"
    elif kind == "stall":
        what = f"{fault['seconds']} s stall"
    else:
        what = {"garbage": "garbage body", "cut": "answer cut off"}[kind]
    count = "past every retry" if times > ATTEMPTS else {1: "once", 2: "twice"}[times]
    return f"{what}, {count}"


def _describe_outcomes(results: list[dict[str, Any]]) -> str:
    if not results:
        return "no result line"
    statuses = collections.Counter(r["status"] for r in results)
    durations = sorted(r["duration_s"] for r in results)
    text = ", ".join(f"{n} {s}" for s, n in statuses.items())
    text += f" in {durations[0]:.1f} to {durations[-1]:.1f} s"
    errors = {r["error"] for r in results if r["error"]}
    if errors:
        text += "; error: " + "; ".join(sorted(e[:120] for e in errors))
    return text


def _clear_model_error(name: str, error: str | None) -> bool:
    if not error:
        return False
    if name == "refused":
        return error.startswith("model request refused, not retried")
    if name == "stalled":
        return f"failed after {ATTEMPTS} attempts" in error and "timed out" in error
    return f"failed after {ATTEMPTS} attempts (last status 500)" in error
