"""Every path-traversal payload of the shared corpus, against every file tool.

Nothing outside the workspace may be read, written, listed, moved or removed: the files next to
the workspace keep their content, no answer shows their text or names, and no path a payload
could mean outside the workspace changes or appears.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import cache
from typing import Any

import pytest

from tests.conftest import REPO
from tests.traversal import outside_targets
from tests.worker.tools.conftest import MARKER, SECRET, Layout, make_registry
from worker.tools.workspace import Workspace

CORPUS = REPO.parent / "shared" / "corpus" / "path-traversal"
#: The corpus's placeholder for "the file to steal": here, the canary next to the workspace.
PLACEHOLDER_TARGET = "sentinel/canary.txt"


@cache
def payloads() -> tuple[str, ...]:
    lines: dict[str, None] = {}
    for corpus_file in sorted(CORPUS.glob("*.txt")):
        for line in corpus_file.read_text(encoding="utf-8").split("\n"):
            lines[line.rstrip("\r").replace("{FILE}", PLACEHOLDER_TARGET)] = None
    return tuple(lines)


Call = tuple[str, Callable[[str], dict[str, Any]]]

CALLS: dict[str, Call] = {
    "read_file": ("read_file", lambda p: {"path": p}),
    "write_file": ("write_file", lambda p: {"path": p, "content": "written by a payload"}),
    "list_dir": ("list_dir", lambda p: {"path": p}),
    "mkdir": ("mkdir", lambda p: {"path": p}),
    "remove": ("remove", lambda p: {"path": p}),
    "move source": ("move", lambda p: {"source": p, "destination": "moved-here"}),
    "move destination": ("move", lambda p: {"source": "victim.txt", "destination": p}),
    "search_text": ("search_text", lambda p: {"query": SECRET[:13], "paths": [p]}),
    "search_files pattern": ("search_files", lambda p: {"pattern": p}),
    "search_files path": ("search_files", lambda p: {"pattern": "**", "path": p}),
}


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the traversal corpus is missing at {CORPUS}")
@pytest.mark.parametrize("case", list(CALLS))
async def test_no_payload_reaches_outside_the_workspace(case: str, layout: Layout) -> None:
    workspace = Workspace(layout.workspace_dir)
    (layout.workspace_dir / "notes.txt").write_text("inside the workspace\n")
    (layout.workspace_dir / "out").symlink_to(layout.sentinel)
    registry = make_registry(workspace, sync_in_thread=False)
    tool, arguments = CALLS[case]
    corpus = payloads()
    outside_before = outside_targets(workspace.root, corpus)
    before = layout.snapshot()

    victim = layout.workspace_dir / "victim.txt"
    spare = layout.workspace_dir / "spare-victim.txt"
    spare.write_text("moved by a payload\n")
    for payload in corpus:
        if case == "move destination" and not victim.exists():
            victim.hardlink_to(spare)  # the cheapest way to a new file to move
        answer = await registry.execute(tool, arguments(payload))
        assert SECRET not in answer, payload
        assert MARKER not in answer, payload

    assert layout.snapshot() == before
    assert outside_targets(workspace.root, corpus) == outside_before
    assert (layout.workspace_dir / "out").resolve() == layout.sentinel


@pytest.mark.skipif(not CORPUS.is_dir(), reason=f"the traversal corpus is missing at {CORPUS}")
def test_the_corpus_is_the_full_shared_list() -> None:
    assert len(payloads()) > 20_000
    assert "../../../../../../etc/passwd" in payloads()
