"""Whatever the arguments, every tool answers with text and touches nothing outside."""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.worker.tools.conftest import MARKER, SECRET, Layout, make_layout, make_registry
from worker.tools.context import ToolContext
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

PARAMETERS = {
    "read_file": ["path", "encoding"],
    "write_file": ["path", "content"],
    "list_dir": ["path"],
    "mkdir": ["path"],
    "remove": ["path"],
    "move": ["source", "destination"],
    "search_text": ["query", "paths", "regex"],
    "search_files": ["pattern", "path"],
    "save_session_context": ["reason"],
    "get_current_weather": ["location"],
}

NAMES = st.sampled_from(
    [
        "..",
        ".",
        "",
        "out",
        "up",
        "sub",
        "file.txt",
        "pipe",
        "sentinel",
        "canary.txt",
        MARKER,
        "etc",
        "passwd",
        "\u2024\u2024",
        "\uff0e\uff0e",
        "-rf",
        "*",
        "**",
        "?",
        "[!a]",
        "%2e%2e",
        "..\\..",
        "~",
        "\x00",
        "\ud800",
        "n" * 300,
        "self",
        "environ",
        "zero",
    ]
)
PREFIXES = st.sampled_from(["", "", "/", "ROOT/", "/proc/", "/dev/", "./", "../"])
PATHS = st.one_of(
    st.builds(
        lambda prefix, names: prefix + "/".join(names), PREFIXES, st.lists(NAMES, max_size=6)
    ),
    st.text(max_size=12),
    st.sampled_from(
        [
            "file.txt",
            "sub",
            "sub/deeper/notes.md",
            ".",
            "sub/deeper/../../file.txt",
            "out/canary.txt",
            "up/sentinel/canary.txt",
            "up/etc/passwd",
            "pipe",
            "zero",
            "environ",
            "ROOT/file.txt",
            "ROOT/../sentinel",
            "/etc/passwd",
            "/proc/self/environ",
        ]
    ),
)
JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10) | PATHS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner),
    max_leaves=6,
)


QUERIES = st.text(min_size=1, max_size=10) | st.sampled_from(
    ["(a+)+$", "inside", SECRET[:12], "[", "\\", "(?i)NOTES", "^$", ".*"]
)
ENCODINGS = st.sampled_from(["utf-8", "latin-1", "utf-16", "hex", "rot13", "nope", ""])

WELL_FORMED: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "read_file": st.fixed_dictionaries({"path": PATHS}, optional={"encoding": ENCODINGS}),
    "write_file": st.fixed_dictionaries({"path": PATHS, "content": st.text(max_size=40)}),
    "list_dir": st.fixed_dictionaries({}, optional={"path": PATHS}),
    "mkdir": st.fixed_dictionaries({"path": PATHS}),
    "remove": st.fixed_dictionaries({"path": PATHS}),
    "move": st.fixed_dictionaries({"source": PATHS, "destination": PATHS}),
    "search_text": st.fixed_dictionaries(
        {"query": QUERIES, "paths": PATHS | st.lists(PATHS, max_size=3)},
        optional={"regex": st.booleans()},
    ),
    "search_files": st.fixed_dictionaries({"pattern": PATHS}, optional={"path": PATHS}),
    "save_session_context": st.fixed_dictionaries({"reason": st.text(max_size=20)}),
    "get_current_weather": st.fixed_dictionaries({"location": st.text(max_size=20)}),
}


def arguments(tool: str) -> st.SearchStrategy[dict[str, Any] | str | None]:
    """Mostly well-formed calls with odd values; also junk of every shape."""
    keys = st.sampled_from([*PARAMETERS[tool], "extra"]) | st.text(max_size=6)
    values = st.one_of(PATHS, PATHS.map(lambda p: [p]), JSON_VALUES)
    junk = st.dictionaries(keys, values, max_size=4)
    well_formed = WELL_FORMED[tool]
    return st.one_of(
        well_formed,
        well_formed.map(json.dumps),
        junk,
        junk.map(lambda d: json.dumps(d, allow_nan=True)),
        st.text(max_size=30),
        st.none(),
    )


def with_root(value: Any, root: str) -> Any:
    if isinstance(value, str):
        return value.replace("ROOT", root)
    if isinstance(value, list):
        return [with_root(v, root) for v in value]
    if isinstance(value, dict):
        return {k: with_root(v, root) for k, v in value.items()}
    return value


def strings_in(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    if isinstance(value, dict):
        return [s for v in value.values() for s in strings_in(v)]
    return []


def outside_state(root: Path, value: Any) -> dict[str, bool]:
    """For each string that, taken as a path, names something outside: whether it exists."""
    found: dict[str, bool] = {}
    for text in strings_in(value):
        if "\x00" in text:
            continue
        target = os.path.normpath(os.path.join(root, text))
        if target != str(root) and not target.startswith(f"{root}{os.sep}"):
            try:
                found[target] = os.path.lexists(target)
            except ValueError:
                continue
    return found


def populate(layout: Layout) -> Workspace:
    root = layout.workspace_dir
    (root / "sub" / "deeper").mkdir(parents=True)
    (root / "file.txt").write_text("inside the workspace\n")
    (root / "sub" / "deeper" / "notes.md").write_text("notes\n")
    (root / "out").symlink_to(layout.sentinel)
    (root / "up").symlink_to("..")
    (root / "zero").symlink_to("/dev/zero")
    (root / "environ").symlink_to("/proc/self/environ")
    os.mkfifo(root / "pipe")
    return Workspace(root)


@pytest.mark.parametrize("tool", list(PARAMETERS))
def test_any_arguments_get_text_and_leave_the_outside_alone(
    tool: str, tmp_path_factory: pytest.TempPathFactory
) -> None:
    layout = make_layout(tmp_path_factory.mktemp(tool))
    workspace = populate(layout)
    context = ToolContext("prompt", [{"role": "user", "content": "hi"}], "saved/context.json")
    registry = make_registry(workspace, context, sync_in_thread=False, search_budget_s=0.5)
    before = layout.snapshot()
    neighbours = sorted(os.listdir(layout.top.parent))

    @settings(
        max_examples=80,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(args=arguments(tool), context_file=PATHS)
    def check(args: dict[str, Any] | str | None, context_file: str) -> None:
        args = with_root(args, str(workspace.root))
        context.session_context_file_path = with_root(context_file, str(workspace.root))
        parsed = json.loads(args) if isinstance(args, str) and _is_json(args) else args
        outside_before = outside_state(workspace.root, [parsed, context_file])
        answer = asyncio.run(call(registry, tool, args))
        assert isinstance(answer, str)
        answer.encode("utf-8")  # valid text for the wire: no lone surrogates
        assert SECRET not in answer
        # The marker may be named back only when the call itself named it (a context file path
        # included: save_session_context writes there).
        assert MARKER not in answer or MARKER in json.dumps(
            [parsed, context_file], ensure_ascii=False
        )
        assert outside_state(workspace.root, [parsed, context_file]) == outside_before
        assert layout.snapshot() == before

    check()
    assert layout.snapshot() == before
    assert sorted(os.listdir(layout.top.parent)) == neighbours


async def call(registry: ToolRegistry, tool: str, args: dict[str, Any] | str | None) -> str:
    return await registry.execute(tool, args)


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True
