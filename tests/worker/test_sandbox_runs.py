"""Per-run uids in process: each run's commands are its own uid, in folders of their own, whichever
launch serves the call (one made for any run, or one made ahead for that run alone)."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import redis

from api.calls.dispatch import Dispatcher
from api.local.stack import worker_argv, worker_environment
from tests.conftest import Caller, RedisServer, WorkerFleet, fleet_settings, wait_for
from tests.worker.conftest import one_uid, run_in_workspace, sandbox_worker_start
from worker.contract.keys import keys
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.uid_range import DEFAULT_UID_RANGE, UidRange
from worker.contract.wire import LAYER_RUN_UID
from worker.exceptions import IdentityError
from worker.retention import prune
from worker.sandbox import (
    SandboxConfig,
)
from worker.sandbox.identity import identity_of
from worker.sandbox.layers import LAYER_PRIVATE_TMP, LAYER_QUOTA_FS, LAYER_TMP_CLEANED
from worker.sandbox.volumes import volumes_unavailable
from worker.tasks import EXIT_CANNOT_ISOLATE
from worker.tools.factory import prepare_workspace

RANGE = UidRange.parse(DEFAULT_UID_RANGE)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need a root worker")


def test_each_run_is_a_uid_of_its_own_on_every_call(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    first = prepare_workspace(root / "run-a", config)
    second = prepare_workspace(root / "run-b", config)
    assert first.owner is not None and second.owner is not None
    assert first.owner != second.owner
    assert first.owner[0] in RANGE and second.owner[0] in RANGE
    # Several calls in turn: after the first, a launch may be made ahead for each run.
    for turn in range(4):
        for workspace in (first, second):
            result = run_in_workspace(
                config, workspace, f"id -u; echo {turn} >> turns; cat turns | wc -l"
            )
            assert result.exit_code == 0, result.stderr
            uid, count = result.stdout.split()
            assert (int(uid), int(uid)) == workspace.owner
            assert int(count) == turn + 1
    layers = run_in_workspace(config, first, "true").isolation
    assert LAYER_RUN_UID in layers
    assert (
        LAYER_PRIVATE_TMP if config.settings.isolation == "namespaces" else LAYER_TMP_CLEANED
    ) in layers


def test_a_workspace_made_again_is_the_one_a_call_sees(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-again", config)
    for _ in range(2):  # the second call leaves a launch made ahead for this run
        assert run_in_workspace(config, workspace, "echo old > mark").exit_code == 0
    shutil.rmtree(workspace.root)
    workspace = prepare_workspace(root / "run-again", config)

    result = run_in_workspace(config, workspace, "ls; echo new > mark; cat mark")

    assert result.stdout.split() == ["new"], result.stderr
    assert (workspace.root / "mark").read_text() == "new\n"


def test_input_reaches_the_command_as_the_runs_uid(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-input", config)
    for _ in range(3):
        result = run_in_workspace(config, workspace, "cat; id -u", stdin=b"from the caller\n")
        assert workspace.owner is not None
        assert result.stdout.splitlines() == ["from the caller", str(workspace.owner[0])]


def test_a_run_cannot_open_its_folder_to_other_runs(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-chmod", config)

    result = run_in_workspace(config, workspace, "chmod 777 .")

    assert result.exit_code != 0
    assert (workspace.root.stat().st_mode & 0o777) == 0o770
    assert (root.stat().st_mode & 0o777) == 0o711


def test_claims_are_one_per_run_and_a_full_range_says_so(tmp_path: Path) -> None:
    tiny = UidRange(5000, 5001)
    # A host registry of the test's own: the host's holds the claims of other fleets.
    host = tmp_path / "host"
    a, b = identity_of(tmp_path, "a", tiny, host), identity_of(tmp_path, "b", tiny, host)
    assert {a, b} == {(5000, 5000), (5001, 5001)}
    assert identity_of(tmp_path, "a", tiny, host) == a
    with pytest.raises(IdentityError, match="TOOLQ_SANDBOX_UID_RANGE=5000-5001"):
        identity_of(tmp_path, "c", tiny, host)


def test_a_uid_range_is_checked() -> None:
    with pytest.raises(ValueError, match="FIRST-LAST"):
        UidRange.parse("20000")
    with pytest.raises(ValueError, match="between 1000"):
        UidRange.parse("10-20")


def test_a_worker_that_cannot_keep_runs_apart_says_what_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    shared = SandboxConfig(one_uid())
    refusal = shared.sharing_refusal()
    assert refusal is not None
    assert "TOOLQ_SANDBOX_UID_RANGE is empty" in refusal
    assert "TOOLQ_SANDBOX_SHARED=allow" in refusal
    assert SandboxConfig(one_uid(shared="allow")).sharing_refusal() is None
    assert SandboxConfig(SandboxSettings(uid_range=str(RANGE))).sharing_refusal() is None
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    not_root = SandboxConfig(SandboxSettings(uid_range=str(RANGE))).sharing_refusal()
    assert not_root is not None and "not root" in not_root


@pytest.mark.integration
def test_a_sandbox_worker_refuses_to_start_with_runs_sharing_a_uid(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    settings = fleet_settings(own_redis.url, tmp_path, sandbox_uid_range="")

    status, lines = sandbox_worker_start(settings)

    assert status == EXIT_CANNOT_ISOLATE
    assert lines == [f"error: {SandboxConfig.from_settings(settings).sharing_refusal()}"]
    # The operator allows it: the worker starts (and is stopped once it said so).
    env = {**os.environ, **worker_environment(settings), "TOOLQ_SANDBOX_SHARED": "allow"}
    argv = worker_argv("sandbox", node="allowed@%h", loglevel="WARNING")
    allowed = subprocess.Popen(argv, env=env, stderr=subprocess.PIPE, text=True)
    try:
        client = redis.Redis.from_url(settings.redis_url)
        wait_for(
            lambda: (
                any(client.scan_iter(keys.worker_heartbeats("sandbox")))
                or allowed.poll() is not None
            ),
            timeout=120,
            what="the allowed worker to announce itself",
        )
        assert allowed.poll() is None
    finally:
        allowed.terminate()
        allowed.wait(30)


@pytest.mark.integration
async def test_a_run_with_no_uid_left_is_told_so_and_nothing_runs(
    own_redis: RedisServer, tmp_path: Path
) -> None:
    root = tmp_path / "workspaces"
    root.mkdir()
    # A host registry of the test's own: the host's holds the claims of other fleets.
    settings = fleet_settings(
        own_redis.url, root, sandbox_uid_range="5000-5000", sandbox_host_state=tmp_path / "host"
    )
    fleet = WorkerFleet(settings).start()
    try:
        async with Dispatcher(settings) as dispatcher:
            first = Caller(dispatcher, settings, "run-takes-the-uid")
            second = Caller(dispatcher, settings, "run-finds-none")
            took = await first("run_bash", {"command": "id -u"})
            refused = await second("run_bash", {"command": "touch ran"})
    finally:
        fleet.stop()
    assert json.loads(took.output)["stdout"].strip() == "5000"
    assert refused.error_kind == "workspace_unavailable"
    assert "TOOLQ_SANDBOX_UID_RANGE=5000-5000" in refused.output
    assert not (root / "run-finds-none" / "ran").exists()


def test_a_run_volume_stops_a_write_past_the_quota(config: SandboxConfig) -> None:
    reason = volumes_unavailable()
    if reason is not None:
        pytest.skip(f"no run volumes here: {reason}")
    quota = 32 << 20
    with_volumes = dataclasses.replace(config, volume_bytes=quota)
    root = Path(str(config.workspace_root))
    first = prepare_workspace(root / "run-fills", with_volumes)
    run_in_workspace(with_volumes, first, "true")  # launches are made ahead for the next runs
    workspace = prepare_workspace(root / "run-overflows", with_volumes)
    try:
        result = run_in_workspace(with_volumes, workspace, "head -c 62914560 /dev/zero > big")
        assert "No space left on device" in result.stderr
        assert (workspace.root / "big").stat().st_size < quota
        assert LAYER_QUOTA_FS in result.isolation
    finally:
        removed = prune(root, 0.0)
    assert {gone.run_id for gone in removed if gone.removed} == {"run-fills", "run-overflows"}
    assert not os.path.ismount(workspace.root)
    assert list((root / ".toolq" / "volumes").glob("*.img")) == []
