"""Workspace: which paths resolve, which are refused and why, and who owns what tools make."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import threading
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from tests.worker.tools.conftest import SECRET, Layout, make_registry
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace, WorkspaceError

NOBODY = (65534, 65534)
as_root = pytest.mark.skipif(os.geteuid() != 0, reason="changing owners needs root")


def test_root_is_created_and_resolved(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "runs" / "run-1" / ".." / "run-1")
    assert workspace.root == tmp_path.resolve() / "runs" / "run-1"
    assert workspace.root.is_dir()
    assert workspace.relative(workspace.root) == "."


def test_a_file_where_the_root_should_be_is_refused(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("")
    with pytest.raises(WorkspaceError, match="not a directory"):
        Workspace(tmp_path / "taken")


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("notes.txt", "notes.txt"),
        ("./a/b/../c.txt", "a/c.txt"),
        ("a//b/", "a/b"),
        (".", "."),
        ("", "."),
        ("\u2024\u2024/x", "\u2024\u2024/x"),
        ("\uff0e\uff0e/x", "\uff0e\uff0e/x"),
        ("..\\..\\etc\\passwd", "..\\..\\etc\\passwd"),
        ("%2e%2e%2fetc", "%2e%2e%2fetc"),
    ],
)
def test_paths_inside_resolve_to_names_inside(
    workspace: Workspace, given: str, expected: str
) -> None:
    assert workspace.relative(workspace.resolve(given)) == expected


def test_absolute_paths_inside_the_workspace_are_fine(workspace: Workspace) -> None:
    assert workspace.resolve(f"{workspace.root}/a/b.txt") == workspace.root / "a" / "b.txt"
    assert workspace.resolve(f"{workspace.root}/") == workspace.root


@pytest.mark.parametrize(
    ("given", "reason"),
    [
        ("..", "through '..'"),
        ("../sentinel/canary.txt", "through '..'"),
        ("a/../../ws/x", "through '..'"),
        ("/etc/passwd", "absolute path outside"),
        ("/proc/self/environ", "absolute path outside"),
        ("/dev/zero", "absolute path outside"),
        ("out/canary.txt", "through a symbolic link"),
        ("out", "through a symbolic link"),
        ("up/sentinel", "through a symbolic link"),
        ("dev-zero", "through a symbolic link"),
        ("a\x00b", "NUL byte"),
        ("\ud800", "cannot be part of a file name"),
        ("a/" * 3000, "too long"),
    ],
)
def test_paths_that_leave_the_workspace_are_refused(
    workspace: Workspace, layout: Layout, given: str, reason: str
) -> None:
    (workspace.root / "out").symlink_to(layout.sentinel)
    (workspace.root / "up").symlink_to("..")
    (workspace.root / "dev-zero").symlink_to("/dev/zero")
    with pytest.raises(WorkspaceError, match=reason):
        workspace.resolve(given)


def test_symlinks_that_stay_inside_are_followed(workspace: Workspace) -> None:
    (workspace.root / "real" / "deep").mkdir(parents=True)
    (workspace.root / "short").symlink_to("real/deep")
    (workspace.root / "absolute").symlink_to(workspace.root / "real")
    assert workspace.resolve("short/x") == workspace.root / "real" / "deep" / "x"
    assert workspace.resolve("short/../y") == workspace.root / "real" / "y"
    assert workspace.resolve("absolute/deep") == workspace.root / "real" / "deep"


def test_entry_names_a_final_symlink_itself(workspace: Workspace, layout: Layout) -> None:
    (workspace.root / "out").symlink_to(layout.sentinel)
    assert workspace.entry("out") == workspace.root / "out"
    assert workspace.entry("out/") == workspace.root / "out"
    with pytest.raises(WorkspaceError, match="symbolic link"):
        workspace.entry("out/canary.txt")


def test_a_symlink_loop_is_refused(workspace: Workspace) -> None:
    (workspace.root / "a").symlink_to("b")
    (workspace.root / "b").symlink_to("a")
    with pytest.raises(WorkspaceError, match="symbolic links"):
        workspace.resolve("a/x")


def test_relative_refuses_paths_outside(workspace: Workspace, layout: Layout) -> None:
    with pytest.raises(WorkspaceError, match="outside the workspace"):
        workspace.relative(layout.sentinel)


# -- a symlink swapped in between the check and the use ----------------------------------------


def swap_for_link(path: Path, target: Path) -> None:
    path.rename(path.with_name(path.name + ".moved"))
    path.symlink_to(target)


def swap_after_check(
    monkeypatch: pytest.MonkeyPatch, checked: str, swap: Callable[[], None]
) -> None:
    """Make the swap happen right after the workspace looked at ``checked`` by name."""
    real_lstat = os.lstat
    done = threading.Event()

    def lstat_then_swap(path: str | os.PathLike[str], *args: object, **kwargs: object) -> object:
        result = real_lstat(path, *args, **kwargs)  # type: ignore[arg-type]
        if not done.is_set() and str(path).endswith(checked):
            done.set()
            swap()
        return result

    monkeypatch.setattr(os, "lstat", lstat_then_swap)


#: Calls that read, write or search sub/secret.txt.
SECRET_CALLS: list[tuple[str, dict[str, object]]] = [
    ("read_file", {"path": "sub/secret.txt"}),
    ("write_file", {"path": "sub/secret.txt", "content": "overwritten"}),
    ("search_text", {"query": "canary", "paths": ["sub/secret.txt"]}),
]
CallAfterSwap = Callable[[str, str, dict[str, object]], Awaitable[str]]


@pytest.fixture
def call_after_swap(
    workspace: Workspace, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> CallAfterSwap:
    """``call_after_swap(swapped, tool, args)``: with sub/secret.txt in the workspace, the
    refusal of ``tool`` when ``swapped`` (sub, or a path in it) is swapped for a link to its twin
    in the sentinel right after the workspace checked it; it tells nothing of what is outside,
    and the swap did happen."""
    (workspace.root / "sub").mkdir()
    (workspace.root / "sub" / "secret.txt").write_text("inside\n")
    registry = make_registry(workspace)

    async def call(swapped: str, tool: str, args: dict[str, object]) -> str:
        path = workspace.root / swapped
        target = layout.sentinel / Path(swapped).relative_to("sub")
        swap_after_check(monkeypatch, f"/{path.name}", lambda: swap_for_link(path, target))
        answer = await registry.execute(tool, args)
        assert answer.startswith(f"Error executing {tool}:"), answer
        assert SECRET not in answer
        assert path.is_symlink()
        return answer

    return call


@pytest.mark.parametrize(
    ("tool", "args"),
    [
        *SECRET_CALLS,
        ("remove", {"path": "sub/secret.txt"}),
        ("move", {"source": "sub/secret.txt", "destination": "moved.txt"}),
    ],
)
async def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(
    call_after_swap: CallAfterSwap, tool: str, args: dict[str, object]
) -> None:
    answer = await call_after_swap("sub", tool, args)
    assert answer.startswith(f"Error executing {tool}: 'sub'"), answer
    assert "symbolic link" in answer
    # The layout fixture checks the sentinel (with its own secret.txt) is unchanged.


@pytest.mark.parametrize(("tool", "args"), SECRET_CALLS)
async def test_a_file_swapped_for_a_symlink_after_the_check_is_not_followed(
    call_after_swap: CallAfterSwap, tool: str, args: dict[str, object]
) -> None:
    await call_after_swap("sub/secret.txt", tool, args)


def test_a_directory_found_outside_through_proc_is_refused(
    workspace: Workspace, layout: Layout, monkeypatch: pytest.MonkeyPatch
) -> None:
    (workspace.root / "sub").mkdir()
    real_readlink = os.readlink

    def moved_out(path: str, *args: object, **kwargs: object) -> str:
        if str(path).startswith("/proc/self/fd/"):
            return str(layout.sentinel)
        return real_readlink(path, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "readlink", moved_out)
    with pytest.raises(WorkspaceError, match="no longer inside the workspace"):
        workspace.write_file(workspace.root / "sub" / "new.txt", b"x")


def test_racing_symlink_swaps_never_lead_outside(workspace: Workspace, layout: Layout) -> None:
    registry = make_registry(workspace, sync_in_thread=False)
    sub = workspace.root / "sub"
    sub.mkdir()
    (sub / "secret.txt").write_text("inside\n")
    parked = workspace.root / "parked"
    stop = threading.Event()
    swapped = threading.Event()

    def swapper() -> None:
        for _ in range(100_000):
            if stop.is_set():
                return
            try:
                sub.rename(parked)
                sub.symlink_to(layout.sentinel)
                sub.unlink()
                parked.rename(sub)
            except OSError:
                put_back()  # a tool made 'sub' while it was away
                continue
            swapped.set()

    def put_back() -> None:
        with contextlib.suppress(OSError):
            if sub.is_symlink():
                sub.unlink()
            elif parked.exists():
                shutil.rmtree(sub)
            parked.rename(sub)

    before = layout.snapshot()
    racer = threading.Thread(target=swapper)
    racer.start()
    answers: list[str] = []
    try:
        assert swapped.wait(timeout=10)

        async def hammer() -> None:
            for _ in range(300):
                answers.append(await registry.execute("read_file", {"path": "sub/secret.txt"}))
                answers.append(
                    await registry.execute(
                        "write_file", {"path": "sub/secret.txt", "content": "from a tool\n"}
                    )
                )
                answers.append(await registry.execute("list_dir", {"path": "sub"}))

        asyncio.run(hammer())
    finally:
        stop.set()
        racer.join(timeout=10)
    assert not racer.is_alive()
    assert all(SECRET not in answer for answer in answers)
    assert layout.snapshot() == before


# -- owners ------------------------------------------------------------------------------------


@as_root
def test_a_new_root_belongs_to_the_owner(tmp_path: Path) -> None:
    workspace = Workspace(tmp_path / "run", owner=NOBODY)
    info = workspace.root.stat()
    assert (info.st_uid, info.st_gid) == NOBODY


@as_root
async def test_everything_tools_create_belongs_to_the_owner(layout: Layout) -> None:
    workspace = Workspace(layout.workspace_dir, owner=NOBODY)
    registry = make_registry(workspace)
    await registry.execute("write_file", {"path": "a/b/c.txt", "content": "x"})
    await registry.execute("mkdir", {"path": "d/e"})
    await registry.execute("save_session_context", {"reason": "owners"})
    (workspace.root / "mine.txt").write_text("made by root")
    await registry.execute("write_file", {"path": "mine.txt", "content": "replaced"})
    for made in ("a", "a/b", "a/b/c.txt", "d", "d/e", "session_context.json", "mine.txt"):
        info = (workspace.root / made).stat()
        assert (info.st_uid, info.st_gid) == NOBODY, made


@as_root
async def test_without_an_owner_a_replaced_file_keeps_its_owner_and_mode(
    workspace: Workspace, registry: ToolRegistry
) -> None:
    theirs = workspace.root / "theirs.sh"
    theirs.write_text("#!/bin/sh\n")
    os.chown(theirs, *NOBODY)
    theirs.chmod(0o750)
    await registry.execute("write_file", {"path": "theirs.sh", "content": "#!/bin/sh\necho\n"})
    info = theirs.stat()
    assert (info.st_uid, info.st_gid) == NOBODY
    assert info.st_mode & 0o777 == 0o750
    assert theirs.read_text() == "#!/bin/sh\necho\n"
