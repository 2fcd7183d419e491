"""search_text and search_files: what matches, how it is shown, and where searching stops."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.worker.conftest import assert_cut_short
from tests.worker.tools.conftest import MARKER, SECRET, Layout, assert_arguments_refused
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.tools.registry import ToolRegistry
from worker.tools.search import SearchFilesTool, SearchTextTool
from worker.tools.workspace import Workspace


@pytest.fixture
def tree(workspace: Workspace, layout: Layout) -> Path:
    root = workspace.root
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "docs").mkdir()
    (root / "src" / "main.py").write_text("import os\nprint('hello world')\n")
    (root / "src" / "pkg" / "util.py").write_text("def hello():\r\n    return 'Hello'\r\n")
    (root / "docs" / "guide.md").write_text("# Guide\nSay hello.\n")
    (root / "notes.txt").write_text("nothing here\n")
    (root / "blob.bin").write_bytes(b"hello\x00\x01\x02")
    (root / "out").symlink_to(layout.sentinel)
    return root


def test_tool_flags(workspace: Workspace) -> None:
    for tool in (SearchTextTool(workspace), SearchFilesTool(workspace)):
        assert tool.idempotent is True
        assert tool.enabled_by_default is True
        schema = tool.get_schema()["function"]["parameters"]
        assert all(field.get("description") for field in schema["properties"].values())
    paths = SearchTextTool(workspace).get_schema()["function"]["parameters"]["properties"]["paths"]
    assert paths["type"] == "array"


# -- search_text -------------------------------------------------------------------------------


async def test_literal_search_over_a_tree(registry: ToolRegistry, tree: Path) -> None:
    answer = await registry.execute("search_text", {"query": "hello", "paths": ["."]})
    assert answer == (
        "docs/guide.md:2:Say hello.\n"
        "src/main.py:2:print('hello world')\n"
        "src/pkg/util.py:1:def hello():\n"
        "[1 binary file skipped]"
    )


async def test_a_single_path_string_is_accepted(registry: ToolRegistry, tree: Path) -> None:
    raw = '{"query": "import", "paths": "src/main.py"}'
    assert await registry.execute("search_text", raw) == "src/main.py:1:import os"


async def test_regex_search(registry: ToolRegistry, tree: Path) -> None:
    answer = await registry.execute(
        "search_text", {"query": r"^\s+return '\w+'$", "paths": ["src", "docs"], "regex": True}
    )
    assert answer == "src/pkg/util.py:2:    return 'Hello'"


async def test_no_matches_say_so(registry: ToolRegistry, tree: Path) -> None:
    answer = await registry.execute("search_text", {"query": "zebra", "paths": ["src", "docs"]})
    assert answer == "No lines match the text 'zebra' in 'src', 'docs'."


async def test_symlinks_out_are_not_followed(registry: ToolRegistry, tree: Path) -> None:
    answer = await registry.execute("search_text", {"query": SECRET[:12], "paths": ["."]})
    assert SECRET not in answer
    refused = await registry.execute("search_text", {"query": "x", "paths": ["out"]})
    assert "leads outside the workspace through a symbolic link" in refused


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"query": "(", "paths": ["."], "regex": True}, "invalid regular expression '('"),
        ({"query": "x", "paths": ["missing"]}, "'missing' does not exist"),
        ({"query": "x", "paths": ["../sentinel"]}, "leads outside the workspace"),
        ({"query": "x", "paths": ["/etc"]}, "outside the workspace"),
        ({"query": "x", "paths": ["src", "a\x00"]}, "contains a NUL byte"),
    ],
)
async def test_search_text_errors(
    registry: ToolRegistry, tree: Path, args: dict[str, object], message: str
) -> None:
    answer = await registry.execute("search_text", args)
    assert answer.startswith("Error executing search_text:") and message in answer, answer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"query": "", "paths": ["."]}, "'query': String should have at least 1 character"),
        ({"query": "x", "paths": []}, "'paths': List should have at least 1 item"),
        ({"query": "x"}, "'paths': Field required"),
        ({"query": "x", "paths": [1]}, "'paths.0': Input should be a valid string"),
        ({"query": "x", "paths": ".", "regex": "maybe"}, "'regex': Input should be"),
        ({"query": "x", "paths": ".", "glob": "*"}, "'glob': unknown parameter"),
    ],
)
async def test_search_text_argument_errors(
    registry: ToolRegistry, args: dict[str, object], message: str
) -> None:
    await assert_arguments_refused(registry, "search_text", args, message)


async def test_a_missing_path_among_others_is_reported(registry: ToolRegistry, tree: Path) -> None:
    answer = await registry.execute("search_text", {"query": "import", "paths": ["src", "gone"]})
    assert answer == "src/main.py:1:import os\n[not searched: 'gone' does not exist]"


async def test_many_matches_are_capped_with_a_count(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "many.txt").write_text("match this line, it is long enough\n" * 5000)
    answer = await registry.execute("search_text", {"query": "match", "paths": ["many.txt"]})
    assert len(answer.encode()) <= DEFAULT_OUTPUT_CAP_BYTES
    assert_cut_short(answer, "many.txt:", 5000, "matches")


async def test_long_lines_are_cut_and_numbered_right(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "wide.txt").write_text("short\n" + "x" * 3_000_000 + "needle\nneedle\n")
    answer = await registry.execute("search_text", {"query": "needle", "paths": ["wide.txt"]})
    first, second = answer.split("\n")
    assert first == "wide.txt:2:" + "x" * 500 + "…"
    assert second == "wide.txt:3:needle"


async def test_a_catastrophic_regex_stops_at_the_time_budget(workspace: Workspace) -> None:
    (workspace.root / "evil.txt").write_text("a" * 5000 + "!\n")
    tool = SearchTextTool(workspace, time_budget_s=0.3)
    # Uncut, this match takes time exponential in the 5,000 a's: an answer at all is the
    # budget's doing, however slow the machine.
    answer = tool.execute({"query": "(a+)+$", "paths": ["evil.txt"], "regex": True})
    assert "[search stopped after its 0.3 s time limit; results are incomplete." in answer


def test_the_default_budget_is_five_seconds(workspace: Workspace) -> None:
    assert SearchTextTool(workspace).time_budget_s == 5.0
    assert SearchFilesTool(workspace).time_budget_s == 5.0


# -- search_files ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "path", "expected"),
    [
        ("**/*.py", ".", "src/main.py\nsrc/pkg/util.py"),
        ("*.txt", ".", "notes.txt"),
        ("src/*.py", ".", "src/main.py"),
        ("*.py", "src", "src/main.py"),
        ("**/*.py", "src/pkg", "src/pkg/util.py"),
        ("**/", ".", "docs/\nsrc/\nsrc/pkg/"),
        ("src/**", ".", "src/main.py\nsrc/pkg/\nsrc/pkg/util.py"),
        ("**/[gm]*", ".", "docs/guide.md\nsrc/main.py"),
        ("**/[!gm]*.??", ".", "src/pkg/util.py"),
        ("./docs//guide.md", ".", "docs/guide.md"),
        ("o*", ".", "out"),
    ],
)
async def test_glob_patterns(
    registry: ToolRegistry, tree: Path, pattern: str, path: str, expected: str
) -> None:
    answer = await registry.execute("search_files", {"pattern": pattern, "path": path})
    assert answer == expected


async def test_no_paths_match_with_a_hint(registry: ToolRegistry, tree: Path) -> None:
    assert await registry.execute("search_files", {"pattern": "*.md"}) == (
        "No paths match '*.md' in '.'. ('*' stays in one directory: try '**/*.md'.)"
    )


async def test_links_out_are_listed_not_entered(registry: ToolRegistry, tree: Path) -> None:
    answer = await registry.execute("search_files", {"pattern": "**"})
    assert "out" in answer.split("\n")
    assert MARKER not in answer and "canary" not in answer


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"pattern": "../*"}, "contains '..'"),
        ({"pattern": "src/../../*"}, "contains '..'"),
        ({"pattern": "/etc/*"}, "is absolute"),
        ({"pattern": "a\x00"}, "NUL byte"),
        ({"pattern": "./"}, "names no files"),
        ({"pattern": "*", "path": ".."}, "leads outside the workspace"),
        ({"pattern": "*", "path": "out"}, "leads outside the workspace"),
        ({"pattern": "*", "path": "notes.txt"}, "'notes.txt' is a file, not a directory"),
    ],
)
async def test_search_files_refusals(
    registry: ToolRegistry, tree: Path, args: dict[str, str], message: str
) -> None:
    answer = await registry.execute("search_files", args)
    assert answer.startswith("Error executing search_files:") and message in answer, answer


async def test_many_paths_are_capped_with_a_count(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "many").mkdir()
    long_name = "generated-" + "x" * 230
    for number in range(300):
        (workspace.root / "many" / f"{long_name}-{number:03}.txt").touch()
    answer = await registry.execute("search_files", {"pattern": "**/*.txt"})
    assert len(answer.encode()) <= DEFAULT_OUTPUT_CAP_BYTES
    assert_cut_short(answer, "many/generated", 300, "paths")
    assert answer.split("\n")[:2] == [f"many/{long_name}-000.txt", f"many/{long_name}-001.txt"]


def test_search_files_stops_at_the_time_budget(workspace: Workspace, tree: Path) -> None:
    answer = SearchFilesTool(workspace, time_budget_s=0).execute({"pattern": "**", "path": "."})
    assert "[search stopped after its 0 s time limit" in answer
