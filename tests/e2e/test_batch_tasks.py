"""``toolq batch`` with tasks, as a user runs it: files and set-up commands the model then reads,
scores by target and by check, limits, artifacts, errors run again, and ``toolq report``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from api.scripted.server import ScriptedServer
from tests.conftest import WorkerFleet, scripted_server
from tests.e2e.test_batch_cli import (
    RUN_TIMEOUT_S,
    TOOLQ,
    batch_argv,
    environment,
    run_batch,
    write_items,
)
from tests.results_file import finished_records as records

pytestmark = pytest.mark.e2e


def read_then_answer(path: str) -> list[dict[str, Any]]:
    return [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": path}}]},
        {"content": "Read: {last_tool_result}"},
    ]


SCRIPTS: dict[str, list[dict[str, Any]]] = {
    "read_input": read_then_answer("input.txt"),
    "read_prepared": read_then_answer("prepared.txt"),
    "paris": [{"content": "The capital of France is Paris."}],
    "write_42": [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "out.txt", "content": "42"}}]},
        {"content": "I wrote the answer to out.txt."},
    ],
    # Writes a note each turn and never answers: only a limit ends it.
    "loop": [
        {"tool_calls": [{"name": "write_file", "arguments": {"path": "n.txt", "content": "x"}}]}
    ]
    * 50,
    "slow_tool": [{"tool_calls": [{"name": "slow_read", "arguments": {"seconds": 8}}]}] * 5,
}


@pytest.fixture
def model(tmp_path: Path) -> Iterator[ScriptedServer]:
    scripts = tmp_path / "scripts"
    scripts.mkdir()
    with scripted_server(scripts, SCRIPTS, default="Done.") as server:
        yield server


def by_id(output: Path) -> dict[str, dict[str, Any]]:
    """Each id's last line, as every reader of a results file takes it."""
    return {record["id"]: record for record in records(output)}


def task(item_id: str, script: str | None = None, **fields: Any) -> dict[str, Any]:
    line: dict[str, Any] = {"id": item_id, "prompt": f"task {item_id}", **fields}
    if script is not None:
        line["model"] = f"scripted:{script}"
    return line


def toolq_report(output: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(TOOLQ), "report", str(output), *extra],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "COLUMNS": "200"},
    )


def test_files_and_setup_prepare_what_the_model_reads_and_a_failed_setup_asks_no_model(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path: Path
) -> None:
    blob = bytes(range(256))
    source = write_items(
        tmp_path / "in.jsonl",
        [
            task(
                "files",
                "read_input",
                files={"input.txt": "apples and pears", "raw/blob.bin": {"base64": b64(blob)}},
            ),
            task("setup", "read_prepared", setup="printf 'made by setup' > prepared.txt"),
            task(
                "broken",
                "paris",
                files={"input.txt": "x"},
                setup="echo 'cannot build' >&2; exit 3",
                check="true",
            ),
        ],
    )
    output = tmp_path / "out.jsonl"

    done = run_batch(source, output, environment(fleet, model))

    assert done.returncode == 1, done.stderr  # the broken set-up
    results = by_id(output)
    assert results["files"]["answer"] == "Read: apples and pears"
    assert results["setup"]["answer"] == "Read: made by setup"
    assert results["setup"]["setup"]["exit_code"] == 0
    broken = results["broken"]
    assert broken["status"] == "error"
    assert broken["error"] == "setup failed: exit code 3: cannot build"
    assert broken["setup"]["stderr"] == "cannot build\n"
    assert broken["messages"] == [] and broken["score"] is None and broken["check"] is None
    # Two model requests for each reading item; none for the broken one.
    assert model.stats()["requests"] == 4
    workspace = Path(fleet.settings.workspace_root) / results["files"]["run_id"]
    assert (workspace / "raw" / "blob.bin").read_bytes() == blob


def test_scores_by_target_and_by_check_and_the_report_of_them(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path: Path
) -> None:
    source = write_items(
        tmp_path / "in.jsonl",
        [
            task("target passes", "paris", target=" PARIS "),
            task("target fails", "paris", target="Lyon"),
            task(
                "check passes", "write_42", check="grep -qx 42 out.txt && echo 'out.txt holds 42'"
            ),
            task("check fails", "write_42", check="grep -qx 43 out.txt"),
            task(
                "check reads the answer",
                "paris",
                check='test "$TOOLQ_ANSWER" = "The capital of France is Paris." && grep -q Paris',
            ),
            task("both, check fails", "paris", target="paris", check="exit 1"),
            task("unscored", "paris", metadata={"split": "dev", "n": 1}),
            task("setup fails", "paris", setup="exit 2", check="true"),
        ],
    )
    output = tmp_path / "out.jsonl"

    done = run_batch(source, output, environment(fleet, model))

    assert done.returncode == 1, done.stderr
    results = by_id(output)
    calls = {item_id: r["tool_calls"] for item_id, r in results.items()}
    assert not any(c["is_error"] for item in calls.values() for c in item), calls
    checks = {item_id: r["check"] for item_id, r in results.items()}
    scores = {item_id: r["score"] for item_id, r in results.items()}
    assert scores["target passes"] == {
        "passed": True,
        "method": "target",
        "explanation": "the answer contains 'PARIS'",
    }
    assert scores["target fails"] == {
        "passed": False,
        "method": "target",
        "explanation": "the answer does not contain 'Lyon'",
    }
    assert scores["check passes"] == {
        "passed": True,
        "method": "check",
        "explanation": "out.txt holds 42\n",
    }, checks
    assert scores["check fails"] == {
        "passed": False,
        "method": "check",
        "explanation": "the check exited with code 1",
    }
    assert scores["check reads the answer"]["passed"] is True
    assert scores["both, check fails"] == {
        "passed": False,
        "method": "both",
        "explanation": "target: the answer contains 'paris'\ncheck: the check exited with code 1",
    }
    assert scores["unscored"] is None and scores["setup fails"] is None
    assert results["unscored"]["metadata"] == {"split": "dev", "n": 1}
    check = results["check fails"]["check"]
    assert set(check) == {"exit_code", "duration_ms", "stdout", "stderr", "timed_out"}
    assert (check["exit_code"], check["timed_out"]) == (1, False)
    # 3 of the 6 scored items passed: the summary and the report say so the same way.
    pass_rate = "Pass rate: 50.0% (3 of 6 scored items; 95% CI 18.8%-81.2%, Wilson)"
    assert pass_rate in done.stderr

    text = toolq_report(output)
    assert text.returncode == 0, text.stderr
    assert pass_rate in text.stdout
    assert "Status: 7 ok, 1 error" in text.stdout
    assert "Setup: 1 ran; 1 exited non-zero (setup fails)" in text.stdout
    report = json.loads(toolq_report(output, "--json").stdout)
    assert report["items"] == 8
    assert report["status"] == {"ok": 7, "error": 1}
    assert report["score"]["scored"] == 6 and report["score"]["passed"] == 3
    assert report["score"]["ci95"] == pytest.approx([0.187616, 0.812384], abs=1e-6)
    assert report["score"]["by_method"] == {"target": 2, "check": 3, "both": 1}
    assert report["check"]["ran"] == 4  # the failed set-up's check never ran
    assert sorted(report["check"]["exited_nonzero"]["ids"]) == ["both, check fails", "check fails"]
    assert report["tool_calls"]["by_tool"] == {"write_file": {"calls": 2, "failed": 0}}
    assert report["tokens"]["total"] == sum(r["usage"]["total_tokens"] for r in results.values())
    assert len(report["slowest"]) == 8


def test_limits_stop_conversations_and_their_checks_still_run(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path: Path
) -> None:
    source = write_items(
        tmp_path / "in.jsonl",
        [
            task("tokens", "loop", token_limit=300, check="test -f n.txt && echo noted"),
            task("time", "slow_tool", time_limit_s=1.5, check='echo "$TOOLQ_STOP_REASON"'),
            task("turns", "loop", max_turns=2, target="turn limit"),
        ],
    )
    output = tmp_path / "out.jsonl"

    done = run_batch(source, output, environment(fleet, model))

    assert done.returncode == 0, done.stderr
    results = by_id(output)
    tokens = results["tokens"]
    assert tokens["stop_reason"] == "token_limit"
    assert tokens["usage"]["total_tokens"] >= 300
    assert 1 < len(tokens["tool_calls"]) < 50
    assert tokens["answer"].startswith("Stopped: the token limit of 300 tokens")
    assert tokens["score"] == {"passed": True, "method": "check", "explanation": "noted\n"}
    timed = results["time"]
    assert timed["stop_reason"] == "time_limit"
    # The slow call (8 s) was not waited for: the limit answered it, however slow the machine.
    assert timed["tool_calls"][0]["error_kind"] == "time_limit"
    assert timed["score"]["explanation"] == "time_limit\n"
    assert results["turns"]["stop_reason"] == "max_turns"
    assert results["turns"]["score"]["passed"] is True  # the closing answer names the limit


def test_artifacts_come_back_as_text_and_base64_each_capped_at_most_100(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path: Path
) -> None:
    blob = bytes(range(256)) * 2
    big = "é" * 30_000  # 60,000 bytes of UTF-8
    source = write_items(
        tmp_path / "in.jsonl",
        [
            task(
                "artifacts",
                files={"big.txt": big, "blob.bin": {"base64": b64(blob)}},
                setup="mkdir many && for n in $(seq 1 120); do echo $n > many/$n.txt; done",
                artifacts=["big.txt", "*.bin", "many/*.txt", "nothing/*"],
            ),
            task("none match", artifacts=["nothing/*"]),
        ],
    )
    output = tmp_path / "out.jsonl"

    done = run_batch(source, output, environment(fleet, model))

    assert done.returncode == 0, done.stderr
    result = by_id(output)["artifacts"]
    artifacts = result["artifacts"]
    assert result["artifacts_matched"] == 122
    assert len(artifacts) == 100
    assert artifacts["big.txt"]["encoding"] == "utf-8"
    assert artifacts["big.txt"]["content"] == "é" * 25_600  # 51,200 bytes
    assert (artifacts["big.txt"]["size"], artifacts["big.txt"]["truncated"]) == (60_000, True)
    binary = artifacts["blob.bin"]
    assert (binary["encoding"], binary["size"], binary["truncated"]) == ("base64", 512, False)
    assert base64.b64decode(binary["content"]) == blob
    assert artifacts["many/1.txt"] == {
        "content": "1\n",
        "encoding": "utf-8",
        "size": 2,
        "truncated": False,
    }
    none = by_id(output)["none match"]
    assert (none["artifacts"], none["artifacts_matched"]) == ({}, 0)


def test_retry_errors_runs_again_exactly_the_error_lines(
    fleet: WorkerFleet, tmp_path: Path
) -> None:
    source = write_items(
        tmp_path / "in.jsonl",
        [
            task("ok 1", "steady", setup="echo ran >> setup.log"),
            task("ok 2", "steady"),
            task("flaky 1", "flaky", setup="echo ran >> setup.log"),
            task("flaky 2", "flaky"),
        ],
    )
    output = tmp_path / "out.jsonl"
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    # The first model knows no "flaky": those items fail; the second one answers them.
    with scripted_server(first_dir, {"steady": [{"content": "fine"}]}) as first:
        failed = run_batch(source, output, environment(fleet, first))
    assert failed.returncode == 1
    assert {k: r["status"] for k, r in by_id(output).items()} == {
        "ok 1": "ok",
        "ok 2": "ok",
        "flaky 1": "error",
        "flaky 2": "error",
    }
    scripts = {"steady": [{"content": "fine"}], "flaky": [{"content": "better now"}]}
    with scripted_server(second_dir, scripts) as second:
        env = environment(fleet, second)
        resumed = run_batch(source, output, env)
        assert "0 ok, 0 error, 0 bad lines skipped, 4 already done (2 of them" in resumed.stderr
        assert second.stats()["requests"] == 0

        retried = retry_errors(source, output, env)
        assert retried.returncode == 0, retried.stderr
        assert "Finished: 2 ok, 0 error, 0 bad lines skipped, 2 already done, 2 errors run" in (
            retried.stderr
        )
        assert second.stats()["requests"] == 2  # the two error lines, nothing else

        again = retry_errors(source, output, env)
        assert "0 ok, 0 error, 0 bad lines skipped, 4 already done" in again.stderr
        assert second.stats()["requests"] == 2

    lines = records(output)
    assert len(lines) == 6  # appended, never rewritten
    assert sorted(r["id"] for r in lines[4:]) == ["flaky 1", "flaky 2"]
    latest = by_id(output)
    assert {r["status"] for r in latest.values()} == {"ok"}
    assert latest["flaky 1"]["answer"] == "better now"
    report = json.loads(toolq_report(output, "--json").stdout)
    assert (report["items"], report["status"]) == (4, {"ok": 4})
    # Set-ups ran once per attempt that reached them, in a workspace started afresh.
    root = Path(fleet.settings.workspace_root)
    for item_id in ("ok 1", "flaky 1"):
        assert (root / latest[item_id]["run_id"] / "setup.log").read_text() == "ran\n"


def test_every_bad_task_field_is_reported_by_line_and_field_and_the_rest_runs(
    fleet: WorkerFleet, model: ScriptedServer, tmp_path: Path
) -> None:
    bad: list[tuple[dict[str, Any], str]] = [
        ({"files": {"/etc/passwd": "x"}}, "files: '/etc/passwd' is absolute"),
        ({"files": {"../../x": "x"}}, "files: '../../x' leads outside the workspace"),
        ({"files": {"a.txt": 7}}, "files: 'a.txt': the content must be a string (UTF-8 text)"),
        ({"files": {"a.bin": {"base64": "%%%"}}}, "files: 'a.bin': the base64 content is not"),
        ({"files": {"big.txt": "x" * 2000}}, "files: 2,000 bytes in all, more than TOOLQ_TASK_"),
        ({"artifacts": ["../*"]}, "artifacts: the pattern '../*' contains '..'"),
        ({"setup": ["make"]}, "setup: Input should be a valid string"),
        ({"check": 1}, "check: Input should be a valid string"),
        ({"time_limit_s": -1}, "time_limit_s: Input should be greater than 0"),
        ({"token_limit": -1}, "token_limit: Input should be greater than 0"),
        ({"setup_timeout_s": -1}, "setup_timeout_s: Input should be greater than 0"),
        ({"check_timeout_s": 0}, "check_timeout_s: Input should be greater than 0"),
    ]
    items: list[dict[str, Any] | str] = [
        task(f"bad {n}", **fields) for n, (fields, _) in enumerate(bad)
    ]
    items.append(task("good", "paris", target="paris"))
    source = write_items(tmp_path / "in.jsonl", items)
    output = tmp_path / "out.jsonl"
    env = {**environment(fleet, model), "TOOLQ_TASK_FILES_MAX_BYTES": "1000"}

    done = run_batch(source, output, env)

    assert done.returncode == 1
    for number, (_, reason) in enumerate(bad, start=1):
        assert f"in.jsonl:{number}: skipped: {reason}" in done.stderr
    assert f"Finished: 1 ok, 0 error, {len(bad)} bad lines skipped" in done.stderr
    assert by_id(output)["good"]["score"]["passed"] is True


def retry_errors(
    source: Path, output: Path, env: dict[str, str]
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*batch_argv(source, output, concurrency=8), "--retry-errors"],
        env=env,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")
