"""Per-run uids in process: each run's commands are its own uid, in folders of their own, whichever
launch serves the call (one made for any run, or one made ahead for that run alone)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker.sandbox import (
    SandboxConfig,
    SandboxError,
    SandboxResult,
    describe_isolation,
    run_sandboxed,
)
from worker.sandbox.identity import DEFAULT_UID_RANGE, IdentityError, UidRange, identity_of
from worker.sandbox.launch import launcher
from worker.sandbox.plan import LAYER_PRIVATE_TMP, LAYER_RUN_UID, LAYER_TMP_CLEANED
from worker.tools.factory import prepare_workspace
from worker.tools.workspace import Workspace

RANGE = UidRange.parse(DEFAULT_UID_RANGE)
pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="per-run uids need a root worker")


@pytest.fixture(params=["namespaces", "process"])
def config(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SandboxConfig]:
    root = tmp_path / "workspaces"
    root.mkdir()
    tmp_path.chmod(0o755)
    made = SandboxConfig(isolation=request.param, workspace_root=str(root), uid_range=RANGE)
    try:
        describe_isolation(made)
    except SandboxError as exc:  # the machine cannot give this mode
        pytest.skip(f"{request.param}: {exc}")
    yield made
    launcher.release()


def _bash(
    config: SandboxConfig, workspace: Workspace, command: str, stdin: bytes | None = None
) -> SandboxResult:
    return run_sandboxed(
        command,
        cwd=workspace.root,
        home=workspace.root,
        env={},
        timeout_ms=10_000,
        config=config,
        identity=workspace.owner,
        stdin=stdin,
    )


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
            result = _bash(config, workspace, f"id -u; echo {turn} >> turns; cat turns | wc -l")
            assert result.exit_code == 0, result.stderr
            uid, count = result.stdout.split()
            assert (int(uid), int(uid)) == workspace.owner
            assert int(count) == turn + 1
    layers = _bash(config, first, "true").isolation
    assert LAYER_RUN_UID in layers
    assert (LAYER_PRIVATE_TMP if config.isolation == "namespaces" else LAYER_TMP_CLEANED) in layers


def test_a_workspace_made_again_is_the_one_a_call_sees(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-again", config)
    for _ in range(2):  # the second call leaves a launch made ahead for this run
        assert _bash(config, workspace, "echo old > mark").exit_code == 0
    shutil.rmtree(workspace.root)
    workspace = prepare_workspace(root / "run-again", config)

    result = _bash(config, workspace, "ls; echo new > mark; cat mark")

    assert result.stdout.split() == ["new"], result.stderr
    assert (workspace.root / "mark").read_text() == "new\n"


def test_input_reaches_the_command_as_the_runs_uid(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-input", config)
    for _ in range(3):
        result = _bash(config, workspace, "cat; id -u", stdin=b"from the caller\n")
        assert workspace.owner is not None
        assert result.stdout.splitlines() == ["from the caller", str(workspace.owner[0])]


def test_a_run_cannot_open_its_folder_to_other_runs(config: SandboxConfig) -> None:
    root = Path(str(config.workspace_root))
    workspace = prepare_workspace(root / "run-chmod", config)

    result = _bash(config, workspace, "chmod 777 .")

    assert result.exit_code != 0
    assert (workspace.root.stat().st_mode & 0o777) == 0o770
    assert (root.stat().st_mode & 0o777) == 0o711


def test_claims_are_one_per_run_and_a_full_range_says_so(tmp_path: Path) -> None:
    tiny = UidRange(5000, 5001)
    a, b = identity_of(tmp_path, "a", tiny), identity_of(tmp_path, "b", tiny)
    assert {a, b} == {(5000, 5000), (5001, 5001)}
    assert identity_of(tmp_path, "a", tiny) == a
    with pytest.raises(IdentityError, match="TOOLQ_SANDBOX_UID_RANGE=5000-5001"):
        identity_of(tmp_path, "c", tiny)


def test_a_uid_range_is_checked() -> None:
    with pytest.raises(ValueError, match="FIRST-LAST"):
        UidRange.parse("20000")
    with pytest.raises(ValueError, match="between 1000"):
        UidRange.parse("10-20")
