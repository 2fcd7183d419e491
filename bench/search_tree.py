"""Case 6: search_text over a tree of many files next to ``grep -rn`` for the same query."""

from __future__ import annotations

import asyncio
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.stats import CaseResult, Comparison
from worker.tools.registry import ToolRegistry
from worker.tools.search import SearchTextTool
from worker.tools.workspace import Workspace

QUERY = "needle_7f3a"
FILES_PER_FOLDER = 100
LINES_PER_FILE = 30
#: One file in this many holds the query, so the answer stays under the output cap.
MATCH_EVERY = 100
#: search_text may take at most this many times grep -rn's time over the same tree.
GOAL_RATIO = 2.0


def make_tree(root: Path, files: int) -> int:
    """``files`` small text files in folders of 100; returns how many lines hold the query."""
    matches = 0
    for index in range(files):
        folder = root / f"dir{index // FILES_PER_FOLDER:04d}"
        folder.mkdir(exist_ok=True)
        lines = [
            f"line {n} of file {index}: lorem ipsum dolor sit amet, consectetur adipiscing\n"
            for n in range(LINES_PER_FILE)
        ]
        if index % MATCH_EVERY == 0:
            lines[LINES_PER_FILE // 2] = f"the {QUERY} is here, in file {index}\n"
            matches += 1
        (folder / f"file{index:05d}.txt").write_text("".join(lines))
    return matches


def _median_seconds(action: Callable[[], None], runs: int) -> float:
    action()  # warm-up: the page cache, imports
    times = []
    for _ in range(runs):
        started = time.perf_counter()
        action()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def search_case(files: int, runs: int) -> CaseResult:
    with tempfile.TemporaryDirectory(prefix="toolq-bench-tree-") as name:
        root = Path(name)
        expected = make_tree(root, files)
        registry = ToolRegistry(sync_in_thread=False)
        registry.register(SearchTextTool(Workspace(root)))
        answers: list[str] = []

        def search_text() -> None:
            args = {"query": QUERY, "paths": ["."]}
            answers.append(asyncio.run(registry.execute("search_text", args)))

        grep_outputs: list[bytes] = []

        def grep() -> None:
            done = subprocess.run(["grep", "-rn", "--", QUERY, "."], cwd=root, capture_output=True)
            grep_outputs.append(done.stdout)

        tool_s = _median_seconds(search_text, runs)
        grep_s = _median_seconds(grep, runs)
    found = sum(QUERY in line for line in answers[-1].splitlines())
    grep_found = grep_outputs[-1].count(b"\n")
    if found != expected or grep_found != expected:
        raise RuntimeError(
            f"search_text found {found} and grep {grep_found} lines, expected {expected}: "
            f"{answers[-1][-500:]}"
        )
    return CaseResult(
        key="search_text",
        title=f"6. search_text over {files:,} files next to grep -rn",
        figures={
            "files": files,
            "lines_per_file": LINES_PER_FILE,
            "matching_lines": expected,
            "search_text_median_s": round(tool_s, 4),
            "grep_median_s": round(grep_s, 4),
            "runs": runs,
        },
        comparisons=[
            Comparison.from_seconds(
                f"search_text over {files:,} files (median)",
                tool_s,
                grep_s,
                "grep -rn",
                digits=2,
                goal=GOAL_RATIO,
            )
        ],
    )
