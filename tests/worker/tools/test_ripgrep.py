"""search_text's first pass with ripgrep: the answers a walk gives, never a line from outside."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.worker.tools.conftest import SECRET, Layout
from worker.tools import ripgrep, search
from worker.tools.search import SearchTextTool
from worker.tools.workspace import Workspace

pytestmark = pytest.mark.skipif(
    ripgrep.ripgrep_command() is None, reason="rg (the ripgrep wheel) or prlimit is missing"
)

NAMES = ["a", "A", "a-b", "a.txt", "b", "é", "z z"]
LINES = [b"needle here", b"nothing", b"\xffneedle\xfe", b"bin\x00needle", b"needle\r", b"NEEDLE"]


def _without_ripgrep(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ripgrep, "ripgrep_command", lambda: None)


def _write_tree(root: Path, files: dict[tuple[str, ...], bytes]) -> None:
    for parts, content in files.items():
        path = root.joinpath(*parts)
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(content)
        except (FileExistsError, NotADirectoryError, IsADirectoryError):
            continue  # a name already taken by a file or a folder of another path


def _lines_and_notes(answer: str) -> tuple[list[str], list[str]]:
    """The matches and the notes, less the binary count (see test_binary_files_counted)."""
    rows = answer.split("\n")
    return [r for r in rows if not r.startswith("[")], [
        r for r in rows if r.startswith("[") and "binary" not in r
    ]


def test_ripgrep_answers_for_a_plain_tree(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "one.txt").write_text("a needle\n")
    (tmp_path / "two.txt").write_text("needle\n")
    (tmp_path / "three.txt").write_text("hay\n")
    assert ripgrep.files_holding("needle", tmp_path, 5.0) == ["two.txt", "sub/one.txt"]
    assert ripgrep.files_holding("line\nbreak", tmp_path, 5.0) is None


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    files=st.dictionaries(
        st.lists(st.sampled_from(NAMES), min_size=1, max_size=3).map(tuple),
        st.lists(st.sampled_from(LINES), max_size=4).map(b"\n".join),
        max_size=8,
    ),
    query=st.sampled_from(["needle", "need", "e h", "NEEDLE", "é"]),
)
def test_the_same_lines_as_a_walk(
    monkeypatch: pytest.MonkeyPatch, files: dict[tuple[str, ...], bytes], query: str
) -> None:
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        _write_tree(root, files)
        tool = SearchTextTool(Workspace(root))
        args = {"query": query, "paths": ["."], "regex": False}
        fast = tool.execute(args)
        with monkeypatch.context() as patched:
            _without_ripgrep(patched)
            walked = tool.execute(args)
    assert _lines_and_notes(fast) == _lines_and_notes(walked)


def test_binary_files_counted_are_those_that_hold_the_text(workspace: Workspace) -> None:
    (workspace.root / "match.bin").write_bytes(b"needle\x00\x01")
    (workspace.root / "other.bin").write_bytes(b"hay\x00\x01")
    (workspace.root / "text.txt").write_text("needle\n")
    answer = SearchTextTool(workspace).execute({"query": "needle", "paths": ["."], "regex": False})
    assert answer == "text.txt:1:needle\n[1 binary file skipped]"


def test_a_file_swapped_for_a_link_after_listing_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, layout: Layout
) -> None:
    (workspace.root / "docs").mkdir()
    (workspace.root / "docs" / "bait.txt").write_text(f"{SECRET[:8]}\n")
    (workspace.root / "docs" / "kept.txt").write_text(f"{SECRET[:8]} kept\n")
    listed: list[list[str] | None] = []

    def list_then_swap(text: str, top: Path, timeout_s: float) -> list[str] | None:
        # What a command racing the search could do between ripgrep's read and ours.
        found = ripgrep.files_holding(text, top, timeout_s)
        listed.append(found)
        bait = workspace.root / "docs" / "bait.txt"
        bait.unlink()
        bait.symlink_to(layout.sentinel / "secret.txt")
        return found

    monkeypatch.setattr(search, "files_holding", list_then_swap)
    answer = SearchTextTool(workspace).execute(
        {"query": SECRET[:8], "paths": ["docs"], "regex": False}
    )
    assert listed == [["bait.txt", "kept.txt"]]
    assert answer == f"docs/kept.txt:1:{SECRET[:8]} kept"
    assert SECRET not in answer


def test_a_folder_swapped_for_a_link_after_listing_is_passed_over(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace, layout: Layout
) -> None:
    (workspace.root / "deep" / "sub").mkdir(parents=True)
    (workspace.root / "deep" / "sub" / "secret.txt").write_text(f"{SECRET[:8]}\n")

    def list_then_swap(text: str, top: Path, timeout_s: float) -> list[str] | None:
        found = ripgrep.files_holding(text, top, timeout_s)
        sub = workspace.root / "deep" / "sub"
        (sub / "secret.txt").unlink()
        sub.rmdir()
        sub.symlink_to(layout.sentinel)
        return found

    monkeypatch.setattr(search, "files_holding", list_then_swap)
    answer = SearchTextTool(workspace).execute(
        {"query": SECRET[:8], "paths": ["deep"], "regex": False}
    )
    assert answer == "No lines match the text 'canary-s' in 'deep'."


def test_links_in_the_tree_are_not_followed(workspace: Workspace, layout: Layout) -> None:
    (workspace.root / "out").symlink_to(layout.sentinel)
    (workspace.root / "secret.txt").symlink_to(layout.sentinel / "secret.txt")
    assert ripgrep.files_holding(SECRET[:8], workspace.root, 5.0) == []


def test_a_tree_too_big_for_the_budget_stops_with_a_note(workspace: Workspace) -> None:
    # Sparse: a terabyte of zeros that ripgrep would read for minutes, stored in no blocks.
    with open(workspace.root / "huge.bin", "wb") as file:
        file.truncate(1 << 40)
    tool = SearchTextTool(workspace, time_budget_s=0.3)
    answer = tool.execute({"query": "needle", "paths": ["."], "regex": False})
    # Only the budget's cut says so (the whole read takes minutes), however slow the machine.
    assert "[search stopped after its 0.3 s time limit; results are incomplete." in answer
    ripgreps = subprocess.run(
        ["pgrep", "-f", f"rg .*{workspace.root}"], capture_output=True, timeout=30
    )
    assert ripgreps.stdout == b"", "rg still runs after the answer"


def test_without_ripgrep_the_walk_answers(
    monkeypatch: pytest.MonkeyPatch, workspace: Workspace
) -> None:
    _without_ripgrep(monkeypatch)
    (workspace.root / "a.txt").write_text("needle\n")
    answer = SearchTextTool(workspace).execute({"query": "needle", "paths": ["."], "regex": False})
    assert answer == "a.txt:1:needle"
