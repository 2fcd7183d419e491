"""Workspace lifetimes: calls touch and hold their run's workspace; idle ones are removed, never
one with a call in flight."""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path

import fakeredis
import pytest

from tests.worker.conftest import request
from worker.contract.settings import WorkerSettings
from worker.exceptions import WorkspaceGone
from worker.executor import Executor
from worker.housekeeping import Housekeeping
from worker.quota import WorkspaceQuota
from worker.results import ResultStore
from worker.retention import empty_trash, hold, prune

DAY = 86_400.0


def make_run(root: Path, name: str, idle_s: float) -> Path:
    run = root / name
    (run / "sub").mkdir(parents=True)
    (run / "sub" / "file").write_text("content")
    then = time.time() - idle_s
    os.utime(run, (then, then))
    return run


def test_prune_removes_only_what_no_call_touched_for_long_enough(tmp_path: Path) -> None:
    old = make_run(tmp_path, "run-old", 2 * DAY)
    recent = make_run(tmp_path, "run-recent", 60)
    (tmp_path / "not a run id").mkdir()

    removed = prune(tmp_path, DAY)

    assert [(e.run_id, e.removed) for e in removed] == [("run-old", True)]
    assert not old.exists()
    assert recent.exists()
    assert (tmp_path / "not a run id").exists()
    assert not list((tmp_path / ".toolq" / "trash").iterdir())


def test_a_dry_run_lists_with_sizes_and_removes_nothing(tmp_path: Path) -> None:
    old = make_run(tmp_path, "run-old", 2 * DAY)

    listed = prune(tmp_path, DAY, dry_run=True, sizes=True)

    assert [(e.run_id, e.removed) for e in listed] == [("run-old", False)]
    assert listed[0].size_bytes is not None and listed[0].size_bytes > 0
    assert listed[0].idle_s >= 2 * DAY - 5
    assert old.exists()


def test_a_workspace_with_a_call_in_flight_stays(tmp_path: Path) -> None:
    run = make_run(tmp_path, "run-busy", 2 * DAY)
    held = os.open(run, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(held, fcntl.LOCK_SH)  # as a call holds it (without touching it)
        kept = prune(tmp_path, 0)
    finally:
        os.close(held)

    assert [(e.run_id, e.removed, e.skipped) for e in kept] == [
        ("run-busy", False, "a call of the run is in flight")
    ]
    assert run.exists()


def test_holding_touches_and_a_removed_workspace_cannot_be_held(tmp_path: Path) -> None:
    run = make_run(tmp_path, "run-1", 2 * DAY)

    fd = hold(run)
    os.close(fd)
    touched = prune(tmp_path, DAY)
    prune(tmp_path, 0)

    assert touched == []  # holding it counted as a touch
    with pytest.raises(WorkspaceGone):
        hold(run)


def test_prune_forgets_the_quota_mark_of_a_removed_run(tmp_path: Path) -> None:
    make_run(tmp_path, "run-1", 2 * DAY)
    quota = WorkspaceQuota(tmp_path, 1)
    quota.account("run-1", tmp_path / "run-1")
    assert quota.refusal("run-1") is not None

    prune(tmp_path, DAY, quota=quota)

    assert quota.refusal("run-1") is None


def test_an_interrupted_removal_is_finished_later(tmp_path: Path) -> None:
    aside = tmp_path / ".toolq" / "trash" / "run-1.abcd"
    aside.mkdir(parents=True)
    (aside / "left").write_text("x")

    empty_trash(tmp_path)

    assert not aside.exists()


def test_a_call_after_its_workspace_was_pruned_gets_a_new_one(tmp_path: Path) -> None:
    settings = WorkerSettings(broker_url="redis://localhost:1/0", workspace_root=tmp_path)
    executor = Executor(settings, ResultStore(fakeredis.FakeRedis(), 60), "test-worker:1")
    executor.handle(request("write_file", {"path": "a.txt", "content": "one"}), "tools")

    prune(tmp_path, 0)
    written = executor.handle(request("write_file", {"path": "b.txt", "content": "two"}), "tools")

    assert not written.is_error, written.output
    assert sorted(p.name for p in (tmp_path / "run-1").iterdir()) == ["b.txt"]


def test_the_workers_housekeeping_removes_expired_workspaces(tmp_path: Path) -> None:
    settings = WorkerSettings(
        broker_url="redis://localhost:1/0", workspace_root=tmp_path, workspace_ttl_s=3600
    )
    old = make_run(tmp_path, "run-old", 7200)
    recent = make_run(tmp_path, "run-recent", 60)

    Housekeeping(settings, ["tools"]).prune_now()

    assert not old.exists()
    assert recent.exists()


def test_a_root_that_does_not_exist_yet_has_nothing_to_prune(tmp_path: Path) -> None:
    root = tmp_path / "not-yet"
    settings = WorkerSettings(
        broker_url="redis://localhost:1/0", workspace_root=root, workspace_ttl_s=3600
    )

    assert prune(root, 0) == []
    Housekeeping(settings, ["tools"]).prune_now()

    assert not root.exists()
