"""``toolq report``: a results file summed up, as text and as one JSON object."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from api.batch.report import build_report, report_lines, run_report_command
from tests.api.batch.conftest import write_lines


def result(
    item_id: str,
    status: str = "ok",
    *,
    passed: bool | None = None,
    method: str = "check",
    stop: str | None = "answered",
    tokens: int = 100,
    seconds: float = 1.0,
    calls: tuple[tuple[str, str | None], ...] = (),
    setup: tuple[int, bool] | None = None,
    check: tuple[int, bool] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    def command(ran: tuple[int, bool] | None) -> dict[str, Any] | None:
        if ran is None:
            return None
        return {
            "exit_code": ran[0],
            "timed_out": ran[1],
            "duration_ms": 5,
            "stdout": "",
            "stderr": "",
        }

    return {
        "id": item_id,
        "status": status,
        "error": error,
        "stop_reason": stop,
        "duration_s": seconds,
        "usage": {"prompt_tokens": tokens - 10, "completion_tokens": 10, "total_tokens": tokens},
        "score": None
        if passed is None
        else {"passed": passed, "method": method, "explanation": "..."},
        "setup": command(setup),
        "check": command(check),
        "tool_calls": [
            {"name": name, "is_error": kind is not None, "error_kind": kind} for name, kind in calls
        ],
    }


@pytest.fixture
def results_file(tmp_path: Path) -> Path:
    return write_lines(
        tmp_path / "out.jsonl",
        [
            result("a", passed=True, tokens=100, seconds=2.0, calls=(("read_file", None),)),
            result(
                "b", passed=False, tokens=200, check=(1, False), calls=(("run_bash", "timeout"),)
            ),
            result("c", passed=True, method="target", tokens=300, seconds=9.5, stop="max_turns"),
            result(
                "d",
                "error",
                stop=None,
                tokens=0,
                setup=(2, False),
                error="setup failed: exit code 2: no such file",
            ),
            result("e", "error", tokens=400, error="the check could not run: no live worker"),
            result(
                "f", passed=False, method="both", tokens=500, check=(-1, True), stop="token_limit"
            ),
            # e ran again and passed: its last line counts, not the error before.
            result("e", passed=True, tokens=600, seconds=4.0, check=(0, False)),
            "not a result",
            result("g", "error", stop=None, tokens=0, error="setup failed: it could not run: none"),
        ],
    )


def test_the_report_counts_each_id_once_by_its_last_line(results_file: Path) -> None:
    report = build_report(results_file)
    assert report["items"] == 7
    assert report["unreadable_lines"] == 1
    assert report["status"] == {"ok": 5, "error": 2}
    assert report["stop_reason"] == {
        "answered": 3,
        "none": 2,
        "max_turns": 1,
        "token_limit": 1,
    }
    score = report["score"]
    assert (score["scored"], score["passed"], score["failed"]) == (5, 3, 2)
    assert score["pass_rate"] == pytest.approx(0.6)
    assert score["ci95"] == pytest.approx([0.230724, 0.882380], abs=1e-6)
    assert score["by_method"] == {"check": 3, "target": 1, "both": 1}
    assert report["tokens"] == {"total": 1700, "p50_per_item": 200, "p95_per_item": 600}
    assert report["tool_calls"] == {
        "total": 2,
        "failed": 1,
        "by_tool": {"read_file": {"calls": 1, "failed": 0}, "run_bash": {"calls": 1, "failed": 1}},
        "by_error_kind": {"timeout": 1},
    }
    assert report["setup"] == {
        "ran": 1,
        "exited_nonzero": {"count": 1, "ids": ["d"]},
        "timed_out": {"count": 0, "ids": []},
        "could_not_run": {"count": 1, "ids": ["g"]},
    }
    assert report["check"]["ran"] == 3
    assert report["check"]["exited_nonzero"] == {"count": 1, "ids": ["b"]}
    assert report["check"]["timed_out"] == {"count": 1, "ids": ["f"]}
    assert report["check"]["could_not_run"] == {"count": 0, "ids": []}  # e ran again
    assert [s["id"] for s in report["slowest"]] == ["c", "e", "a", "b", "d", "f", "g"]
    assert report["slowest"][0] == {
        "id": "c",
        "duration_s": 9.5,
        "status": "ok",
        "stop_reason": "max_turns",
    }


def test_the_report_as_text(results_file: Path) -> None:
    lines = report_lines(build_report(results_file))
    assert lines[:10] == [
        f"{results_file}: 7 items (1 lines that are not results ignored)",
        "Status: 5 ok, 2 error",
        "Stop reasons: 3 answered, 2 none, 1 max_turns, 1 token_limit",
        "Pass rate: 60.0% (3 of 5 scored items; 95% CI 23.1%-88.2%, Wilson)",
        "  by method: 3 check, 1 target, 1 both",
        "Tokens: 1,700 in all; per item p50 200, p95 600",
        "Tool calls: 2, 1 failed",
        "  by tool: read_file 1 (0 failed), run_bash 1 (1 failed)",
        "  by error kind: 1 timeout",
        "Setup: 1 ran; 1 exited non-zero (d); 1 could not run (g)",
    ]
    assert lines[10] == "Check: 3 ran; 1 exited non-zero (b); 1 timed out (f)"
    assert lines[11] == "Slowest items:"
    assert lines[12] == "      9.50 s  c (ok, max_turns)"
    assert len(lines) == 12 + 7


def test_a_file_without_scores_says_so(tmp_path: Path) -> None:
    path = write_lines(tmp_path / "out.jsonl", [result("a"), result("b", "error")])
    report = build_report(path)
    assert report["score"] is None
    assert "Pass rate: no item was scored (no target or check)" in report_lines(report)


def test_the_command_prints_text_or_one_json_object(results_file: Path, tmp_path: Path) -> None:
    out, err = Console(file=io.StringIO(), width=80), Console(file=io.StringIO())
    assert run_report_command(results_file, as_json=True, out=out, err=err) == 0
    printed = out.file.getvalue()  # type: ignore[attr-defined]
    assert printed.count("\n") == 1  # one line, however narrow the terminal
    assert json.loads(printed) == build_report(results_file)

    text = Console(file=io.StringIO(), width=80)
    assert run_report_command(results_file, as_json=False, out=text, err=err) == 0
    assert "Pass rate: 60.0%" in text.file.getvalue()  # type: ignore[attr-defined]

    missing = run_report_command(tmp_path / "nope.jsonl", as_json=False, out=out, err=err)
    assert missing == 2
    assert "cannot read" in err.file.getvalue()  # type: ignore[attr-defined]


def test_a_batchs_input_is_refused_with_one_line(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "in.jsonl", [{"id": f"q{n}", "prompt": "what is 6 x 7?"} for n in range(62)]
    )
    out, err = Console(file=io.StringIO()), Console(file=io.StringIO(), width=80)

    code = run_report_command(path, as_json=False, out=out, err=err)

    assert code == 2
    assert out.file.getvalue() == ""  # type: ignore[attr-defined]
    assert err.file.getvalue() == (  # type: ignore[attr-defined]
        f"error: {path} holds no batch results: none of its 62 lines is a result (an object "
        "with an id and a status); toolq report reads what toolq batch -o writes, not a "
        "batch's input\n"
    )


def test_input_lines_among_results_are_not_counted_as_failures(tmp_path: Path) -> None:
    path = write_lines(
        tmp_path / "out.jsonl", [result("a"), {"id": "b", "prompt": "p"}, result("c")]
    )

    report = build_report(path)

    assert report["items"] == 2
    assert report["status"] == {"ok": 2}
    assert report["unreadable_lines"] == 1
