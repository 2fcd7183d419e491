"""Service operations as a worker runs them: files in and out, commands with argv and input."""

from __future__ import annotations

import base64
import json
import os
from pathlib import Path
from typing import Any

import fakeredis
import pytest

from tests.worker.conftest import request
from worker.contract.settings import WorkerSettings
from worker.executor import Executor
from worker.manifest import fleet_tool_specs
from worker.results import ResultStore
from worker.retention import hold

SERVICE_OPERATIONS = {
    "toolq.put_files": "tools",
    "toolq.read_file": "tools",
    "toolq.collect_files": "tools",
    "toolq.remove_workspace": "tools",
    "toolq.list_workspaces": "tools",
    "toolq.exec": "sandbox",
}


@pytest.fixture
def settings(tmp_path: Path) -> WorkerSettings:
    root = tmp_path / "workspaces"
    root.mkdir()
    os.chmod(tmp_path, 0o755)
    return WorkerSettings(
        broker_url="redis://localhost:1/0", workspace_root=root, transfer_max_bytes=4096
    )


@pytest.fixture
def executor(settings: WorkerSettings) -> Executor:
    return Executor(settings, ResultStore(fakeredis.FakeRedis(), 60), "test-worker:1")


def call(executor: Executor, operation: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = executor.handle(request(operation, arguments), SERVICE_OPERATIONS[operation])
    assert not result.is_error, result.output
    answer: dict[str, Any] = json.loads(result.output)
    return answer


def test_service_operations_are_published_but_not_for_models(settings: WorkerSettings) -> None:
    specs = {spec.name: spec for spec in fleet_tool_specs(settings)}
    for name, pool in SERVICE_OPERATIONS.items():
        assert specs[name].pool == pool
        assert specs[name].for_model is False
    assert specs["read_file"].for_model is True


def test_files_go_in_and_come_back_whole(executor: Executor, settings: WorkerSettings) -> None:
    binary = bytes(range(256))
    written = call(
        executor,
        "toolq.put_files",
        {"files": {"a/b.txt": "héllo", "c.bin": {"base64": base64.b64encode(binary).decode()}}},
    )
    assert written == {"ok": True, "written": {"a/b.txt": 6, "c.bin": 256}}
    assert (settings.workspace_root / "run-1" / "a" / "b.txt").read_text() == "héllo"
    read = call(executor, "toolq.read_file", {"path": "c.bin"})
    assert base64.b64decode(read["base64"]) == binary


@pytest.mark.parametrize(
    ("path", "kind"),
    [("missing.txt", "not_found"), ("a", "is_a_directory"), ("../../etc/passwd", "refused")],
)
def test_a_path_that_cannot_be_read_says_why(executor: Executor, path: str, kind: str) -> None:
    call(executor, "toolq.put_files", {"files": {"a/x.txt": "x"}})
    answer = call(executor, "toolq.read_file", {"path": path})
    assert answer["ok"] is False and answer["error"] == kind, answer


def test_transfers_past_the_limit_are_refused(executor: Executor) -> None:
    refused = executor.handle(
        request("toolq.put_files", {"files": {"big.txt": "x" * 5000}}), "tools"
    )
    assert refused.is_error and "4,096 bytes one transfer may carry" in refused.output
    call(executor, "toolq.put_files", {"files": {"a.txt": "x" * 3000, "b.txt": "y" * 1000}})
    assert call(executor, "toolq.read_file", {"path": "a.txt", "max_bytes": 100}) == {
        "ok": False,
        "error": "too_large",
        "message": "'a.txt' has 3,000 bytes, more than the 100 this read may take",
    }


@pytest.mark.parametrize(
    ("path", "kind"),
    [("a", "is_a_directory"), ("../outside.txt", "refused"), ("a/x.txt/y", "refused")],
)
def test_a_path_that_cannot_be_written_says_why_and_what_was_written(
    executor: Executor, path: str, kind: str
) -> None:
    call(executor, "toolq.put_files", {"files": {"a/x.txt": "x"}})
    answer = call(executor, "toolq.put_files", {"files": {"first.txt": "1", path: "2"}})
    assert answer["ok"] is False and answer["error"] == kind, answer
    assert answer["written"] == {"first.txt": 1}


def test_bad_base64_names_the_file(executor: Executor) -> None:
    refused = executor.handle(
        request("toolq.put_files", {"files": {"x.bin": {"base64": "@@@"}}}), "tools"
    )
    assert refused.is_error and "'x.bin': the base64 content is not valid base64" in refused.output


def test_collect_files_matches_globs_caps_each_file_and_counts_the_rest(
    executor: Executor,
) -> None:
    files: dict[str, Any] = {f"out/{n}.txt": f"file {n} " * 10 for n in range(5)}
    files["out/raw.bin"] = {"base64": base64.b64encode(b"\xff\xfe\x00").decode()}
    files["notes.md"] = "not an artifact"
    call(executor, "toolq.put_files", {"files": files})
    os.symlink("/etc/passwd", executor.runner.workspace("run-1").root / "out" / "link.txt")
    answer = call(
        executor,
        "toolq.collect_files",
        {"patterns": ["out/*.txt", "**/*.bin"], "max_files": 3, "max_file_bytes": 12},
    )
    assert answer["matched"] == 6  # five texts and the binary; the link is not a regular file
    assert list(answer["files"]) == ["out/0.txt", "out/1.txt", "out/2.txt"]
    first = answer["files"]["out/0.txt"]
    assert first == {"content": "file 0 file ", "encoding": "utf-8", "size": 70, "truncated": True}
    binary = call(executor, "toolq.collect_files", {"patterns": ["out/raw.bin"]})["files"]
    assert binary["out/raw.bin"]["encoding"] == "base64"
    assert base64.b64decode(binary["out/raw.bin"]["content"]) == b"\xff\xfe\x00"


def test_a_text_cut_inside_a_character_still_comes_back_as_text(executor: Executor) -> None:
    call(executor, "toolq.put_files", {"files": {"accents.txt": "é" * 10}})  # 2 bytes each
    answer = call(executor, "toolq.collect_files", {"patterns": ["*.txt"], "max_file_bytes": 7})
    found = answer["files"]["accents.txt"]
    assert found == {"content": "ééé", "encoding": "utf-8", "size": 20, "truncated": True}


def test_a_pattern_that_leaves_the_workspace_is_refused(executor: Executor) -> None:
    refused = executor.handle(request("toolq.collect_files", {"patterns": ["../*"]}), "tools")
    assert refused.is_error and "'..'" in refused.output


def test_exec_takes_an_argv_and_input_and_caps_its_streams(executor: Executor) -> None:
    answer = call(
        executor,
        "toolq.exec",
        {"argv": ["/bin/sh", "-c", "cat; echo done >&2"], "input": "from stdin\n"},
    )
    assert answer["stdout"] == "from stdin\n"
    assert answer["stderr"] == "done\n"
    assert answer["exit_code"] == 0 and answer["timed_out"] is False
    capped = call(
        executor,
        "toolq.exec",
        {"command": "head -c 3000 /dev/zero | tr '\\0' a", "output_cap_bytes": 1000},
    )
    assert capped["truncated"]["stdout"] is True
    kept, notice = capped["stdout"].split("\n", 1)
    assert kept == "a" * 1000
    assert notice == "[output truncated: showing the first 1,000 of 3,000 bytes]"


def test_exec_wants_exactly_one_of_argv_and_command(executor: Executor) -> None:
    refused = executor.handle(
        request("toolq.exec", {"argv": ["true"], "command": "true"}), "sandbox"
    )
    assert refused.is_error and "exactly one of 'argv' and 'command'" in refused.output


def test_remove_workspace_removes_the_runs_folder(
    executor: Executor, settings: WorkerSettings
) -> None:
    call(executor, "toolq.put_files", {"files": {"a/b.txt": "x"}})
    assert call(executor, "toolq.remove_workspace", {}) == {"ok": True, "removed": True}
    assert not (settings.workspace_root / "run-1").exists()


def test_a_workspace_another_call_holds_is_kept_until_that_call_ends(
    executor: Executor, settings: WorkerSettings
) -> None:
    call(executor, "toolq.put_files", {"files": {"kept.txt": "x"}})
    folder = settings.workspace_root / "run-1"
    in_flight = hold(folder)  # as a call of the run holds it while it runs
    try:
        answer = call(executor, "toolq.remove_workspace", {})
        assert answer == {"ok": True, "removed": False, "kept": "a call of the run is in flight"}
        assert (folder / "kept.txt").read_text() == "x"
    finally:
        os.close(in_flight)
    assert call(executor, "toolq.remove_workspace", {}) == {"ok": True, "removed": True}
    assert not folder.exists()
    # The run goes on in a new, empty workspace.
    assert call(executor, "toolq.put_files", {"files": {"new.txt": "y"}})["ok"] is True
    assert sorted(os.listdir(folder)) == ["new.txt"]


def test_list_workspaces_names_the_other_runs_whose_ids_start_so(
    executor: Executor, settings: WorkerSettings
) -> None:
    for run in ("inspect-a-1", "inspect-b-2", "mcp-3"):
        executor.handle(request("toolq.put_files", {"files": {"f": "x"}}, run_id=run), "tools")
    (settings.workspace_root / "inspect-not-a-folder").write_text("")
    listed = call(executor, "toolq.list_workspaces", {"prefix": "inspect-"})  # asked from run-1
    assert listed == {"ok": True, "runs": ["inspect-a-1", "inspect-b-2"], "matched": 2}
    asked_from_inside = executor.handle(
        request("toolq.list_workspaces", {"prefix": "inspect-"}, run_id="inspect-a-1"), "tools"
    )
    assert json.loads(asked_from_inside.output)["runs"] == ["inspect-b-2"]
