"""Case 8: ``toolq view`` on a large results file, next to ``jq -s length`` reading the same file.

The viewer must answer its first page without parsing the whole file first: the time from
starting ``toolq view`` to the first page of results (the browser's first request) is compared
with the time ``jq -s length`` takes to read the file, both measured in the same run.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.stats import CaseResult, Comparison

TOOLQ = str(Path(sys.executable).parent / "toolq")
#: The first page must come in at most this share of jq's time.
GOAL_RATIO = 0.5
#: A row of the first page, as the table shows it: the first item's id.
FIRST_ID = "q0000000"


def result_line(n: int, rng: random.Random) -> dict[str, Any]:
    """An output line as ``toolq batch`` writes it: two tool calls and six messages (~2 KB)."""
    ok = rng.random() > 0.1
    note = f"Note number {n}: {rng.getrandbits(64):x}"
    write = {"path": "note.txt", "content": note}
    calls = [
        {
            "id": f"call_{n}_w",
            "name": "write_file",
            "arguments": json.dumps(write),
            "output": f"Wrote {len(note)} bytes to note.txt.",
            "is_error": False,
            "error_kind": None,
            "duration_ms": round(rng.uniform(1, 50), 3),
            "wall_ms": round(rng.uniform(50, 300), 3),
            "worker": "bench:1000",
            "turn": 1,
            "truncated": False,
        },
        {
            "id": f"call_{n}_r",
            "name": "read_file",
            "arguments": json.dumps({"path": "note.txt"}),
            "output": note if ok else "Error executing read_file: gone",
            "is_error": not ok,
            "error_kind": None if ok else "tool_error",
            "duration_ms": round(rng.uniform(1, 50), 3),
            "wall_ms": round(rng.uniform(50, 300), 3),
            "worker": "bench:1000",
            "turn": 2,
            "truncated": False,
        },
    ]

    def asked(call: dict[str, Any]) -> dict[str, Any]:
        function = {"name": call["name"], "arguments": call["arguments"]}
        return {"id": call["id"], "type": "function", "function": function}

    answer = f"Read back: {note}"
    return {
        "id": f"q{n:07d}",
        "status": "ok",
        "answer": answer,
        "error": None,
        "stop_reason": "answered",
        "run_id": f"b-0badcafe-q{n:07d}-{n % 997:06x}",
        "model": "scripted",
        "duration_s": round(rng.uniform(0.2, 5.0), 3),
        "usage": {"prompt_tokens": 177, "completion_tokens": 27, "total_tokens": 204},
        "tool_calls": calls,
        "messages": [
            {"role": "system", "content": "You are a helpful assistant with tools."},
            {"role": "user", "content": note},
            {"role": "assistant", "content": "Saving it first.", "tool_calls": [asked(calls[0])]},
            {"role": "tool", "tool_call_id": calls[0]["id"], "content": calls[0]["output"]},
            {"role": "assistant", "content": None, "tool_calls": [asked(calls[1])]},
            {"role": "tool", "tool_call_id": calls[1]["id"], "content": calls[1]["output"]},
            {"role": "assistant", "content": answer},
        ],
    }


def write_results(path: Path, lines: int, seed: int = 7) -> int:
    """A results file of ``lines`` lines; returns its size in bytes."""
    rng = random.Random(seed)
    with path.open("w") as out:
        for n in range(lines):
            out.write(json.dumps(result_line(n, rng)) + "\n")
    return path.stat().st_size


def jq_seconds(path: Path) -> float:
    started = time.perf_counter()
    done = subprocess.run(["jq", "-s", "length", str(path)], capture_output=True, check=True)
    elapsed = time.perf_counter() - started
    if int(done.stdout) <= 0:
        raise RuntimeError(f"jq read no lines of {path}")
    return elapsed


def first_page_seconds(path: Path) -> float:
    """From starting ``toolq view`` to its first page of results, read whole."""
    started = time.perf_counter()
    proc = subprocess.Popen(
        [TOOLQ, "view", str(path), "--no-browser"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if " at http" not in line:
            error = proc.stderr.read() if proc.stderr else ""
            raise RuntimeError(f"toolq view printed {line!r}: {error}")
        url = line.split(" at ", 1)[1].split()[0]
        with urllib.request.urlopen(url, timeout=60) as response:
            page = response.read().decode()
        elapsed = time.perf_counter() - started
        if FIRST_ID not in page:
            raise RuntimeError(f"the first page of {url} does not list {FIRST_ID}")
        return elapsed
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def viewer_case(lines: int, runs: int) -> CaseResult:
    if shutil.which("jq") is None:
        raise RuntimeError("jq is not installed (make install installs it where apt-get can)")
    with tempfile.TemporaryDirectory(prefix="toolq-bench-view-") as name:
        path = Path(name) / "results.jsonl"
        size = write_results(path, lines)
        jq_seconds(path)  # warm-up: the file in the page cache for both
        first_page_seconds(path)
        jq_times, view_times = [], []
        for _ in range(runs):  # alternating, so that a busy moment costs both alike
            jq_times.append(jq_seconds(path))
            view_times.append(first_page_seconds(path))
    jq_s = statistics.median(jq_times)
    view_s = statistics.median(view_times)
    return CaseResult(
        key="viewer",
        title=f"8. toolq view's first page of a {lines:,}-line results file, next to jq -s length",
        figures={
            "lines": lines,
            "file_megabytes": round(size / 1e6, 1),
            "first_page_median_s": round(view_s, 3),
            "jq_median_s": round(jq_s, 3),
            "runs": runs,
        },
        comparisons=[
            Comparison.from_seconds(
                f"first page of {lines:,} lines (median, from the command's start)",
                view_s,
                jq_s,
                "jq -s length",
                digits=1,
                goal=GOAL_RATIO,
            )
        ],
    )
