"""read_file, write_file, list_dir, mkdir, remove and move, through the registry."""

from __future__ import annotations

import json
import os
import socket
import stat
from pathlib import Path

import pytest

from tests.traversal import NUL_PATH_CALLS, calls_naming
from tests.worker.conftest import assert_cut_short
from tests.worker.tools.conftest import SECRET, Layout, assert_arguments_refused
from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES
from worker.tools import filesystem
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

as_root = pytest.mark.skipif(os.geteuid() != 0, reason="making device files needs root")


def fits_the_cap(answer: str) -> bool:
    return len(answer.encode("utf-8")) <= DEFAULT_OUTPUT_CAP_BYTES


def test_tool_flags(workspace: Workspace) -> None:
    idempotent = {filesystem.ReadFileTool, filesystem.ListDirTool, filesystem.MkdirTool}
    for tool in (
        filesystem.ReadFileTool,
        filesystem.WriteFileTool,
        filesystem.ListDirTool,
        filesystem.MkdirTool,
        filesystem.RemoveTool,
        filesystem.MoveTool,
    ):
        assert tool.idempotent is (tool in idempotent), tool.name
        assert tool.enabled_by_default is (tool is not filesystem.RemoveTool), tool.name
        schema = tool(workspace).get_schema()["function"]["parameters"]
        assert schema["additionalProperties"] is False
        assert all(field.get("description") for field in schema["properties"].values())


# -- write_file and read_file ------------------------------------------------------------------


async def test_written_text_reads_back(registry: ToolRegistry, workspace: Workspace) -> None:
    text = "héllo wörld\nsecond line\n"
    answer = await registry.execute("write_file", {"path": "deep/er/notes.txt", "content": text})
    assert answer == "Wrote 26 bytes to deep/er/notes.txt."
    assert (workspace.root / "deep" / "er" / "notes.txt").read_text() == text
    raw = json.dumps({"path": "deep/er/notes.txt"})
    assert await registry.execute("read_file", raw) == text


async def test_write_replaces_and_leaves_no_temporary_files(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    await registry.execute("write_file", {"path": "a.txt", "content": "first version, long"})
    await registry.execute("write_file", '{"path": "a.txt", "content": "second"}')
    assert (workspace.root / "a.txt").read_text() == "second"
    assert sorted(p.name for p in workspace.root.iterdir()) == ["a.txt"]


async def test_an_empty_file_says_so(registry: ToolRegistry) -> None:
    await registry.execute("write_file", {"path": "empty.txt", "content": ""})
    assert await registry.execute("read_file", {"path": "empty.txt"}) == (
        "(empty.txt is empty: 0 bytes)"
    )


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("dir", "'dir' is a directory"),
        ("dir/", "ends with '/'"),
        (".", "workspace root"),
        ("file.txt/inner.txt", "'file.txt' is a file, not a directory"),
    ],
)
async def test_write_refuses_what_is_not_a_file_name(
    registry: ToolRegistry, workspace: Workspace, path: str, message: str
) -> None:
    (workspace.root / "dir").mkdir()
    (workspace.root / "file.txt").write_text("kept\n")
    answer = await registry.execute("write_file", {"path": path, "content": "x"})
    assert answer.startswith("Error executing write_file:") and message in answer, answer
    assert (workspace.root / "file.txt").read_text() == "kept\n"


async def test_read_of_missing_and_of_a_directory(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "dir").mkdir()
    missing = await registry.execute("read_file", {"path": "nope/none.txt"})
    assert missing == "Error executing read_file: 'nope' does not exist"
    directory = await registry.execute("read_file", {"path": "dir"})
    assert "'dir' is a directory; use list_dir" in directory


async def test_binary_content_is_refused(registry: ToolRegistry, workspace: Workspace) -> None:
    (workspace.root / "image.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" * 10)
    answer = await registry.execute("read_file", {"path": "image.png"})
    assert answer == (
        "Error executing read_file: 'image.png' is a binary file (160 bytes); read_file only "
        "shows text"
    )


async def test_undecodable_bytes_name_the_encoding_and_offset(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "latin.txt").write_bytes("café au lait\n".encode("latin-1"))
    answer = await registry.execute("read_file", {"path": "latin.txt"})
    assert "not valid utf-8 text: byte 0xe9 at offset 3" in answer
    assert "encoding='latin-1'" in answer
    fixed = await registry.execute("read_file", {"path": "latin.txt", "encoding": "latin-1"})
    assert fixed == "café au lait\n"


async def test_utf16_text_is_not_mistaken_for_binary(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "wide.txt").write_bytes("wide text\n".encode("utf-16"))
    answer = await registry.execute("read_file", {"path": "wide.txt", "encoding": "UTF-16"})
    assert answer == "wide text\n"


@pytest.mark.parametrize("encoding", ["klingon", "hex", "rot13", "", "utf-8\x00"])
async def test_unknown_encodings_are_named(
    registry: ToolRegistry, workspace: Workspace, encoding: str
) -> None:
    (workspace.root / "a.txt").write_text("text\n")
    answer = await registry.execute("read_file", {"path": "a.txt", "encoding": encoding})
    assert answer.startswith("Error executing read_file: unknown text encoding"), answer
    assert "'utf-8'" in answer


async def test_a_huge_file_is_cut_with_its_full_size(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    line = "é" * 39 + "\n"  # 79 bytes, the two-byte characters straddle every boundary
    (workspace.root / "big.log").write_text(line * 2000)
    answer = await registry.execute("read_file", {"path": "big.log"})
    assert fits_the_cap(answer)
    assert answer.startswith(line * 100)
    assert "big.log has 158,000 bytes; only its first" in answer


def bytes_read() -> int:
    """Bytes this process (all its threads) has read so far, as the kernel counts them."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("/proc/self/io has no rchar line")


async def test_a_5_gb_sparse_file_is_answered_without_reading_it(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    with (workspace.root / "sparse.txt").open("wb") as file:
        file.write(b"header line\n" * 1000)
        file.truncate(5 * 1024**3)
    (workspace.root / "zeros.bin").open("wb").truncate(5 * 1024**3)
    read_before = bytes_read()
    text = await registry.execute("read_file", {"path": "sparse.txt"})
    zeros = await registry.execute("read_file", {"path": "zeros.bin"})
    # What the tool read, not how long it took: reading either file would be gigabytes.
    assert bytes_read() - read_before < 10 * 1024**2
    assert text.startswith("header line\n" * 1000)
    assert "sparse.txt has 5,368,709,120 bytes" in text and fits_the_cap(text)
    assert zeros == (
        "Error executing read_file: 'zeros.bin' is a binary file (5,368,709,120 bytes); "
        "read_file only shows text"
    )


async def test_special_files_are_refused_without_blocking(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    os.mkfifo(workspace.root / "pipe")
    (workspace.root / "zero").symlink_to("/dev/zero")
    (workspace.root / "environ").symlink_to("/proc/self/environ")
    pipe = await registry.execute("read_file", {"path": "pipe"})
    assert pipe == (
        "Error executing read_file: 'pipe' is a named pipe (FIFO), not a regular file; "
        "only regular files can be read"
    )
    for path in ("zero", "environ", "/dev/zero", "/proc/self/environ"):
        answer = await registry.execute("read_file", {"path": path})
        assert "leads outside the workspace" in answer or "outside the workspace" in answer
    written = await registry.execute("write_file", {"path": "pipe", "content": "x"})
    assert "'pipe' is a named pipe (FIFO); write_file only writes regular files" in written


async def test_a_socket_is_refused(
    registry: ToolRegistry, workspace: Workspace, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace.root)  # socket paths are short; the workspace path may not be
    with socket.socket(socket.AF_UNIX) as server:
        server.bind("sock")
        answer = await registry.execute("read_file", {"path": "sock"})
        searched = await registry.execute("search_text", {"query": "x", "paths": ["sock"]})
    assert "'sock' is a socket, not a regular file" in answer
    assert searched == "Error executing search_text: 'sock' is a socket"


@as_root
async def test_a_device_inside_the_workspace_is_refused(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    os.mknod(workspace.root / "null", 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    answer = await registry.execute("read_file", {"path": "null"})
    assert "'null' is a character device, not a regular file" in answer


async def test_three_hundred_character_names_get_a_clear_message(
    registry: ToolRegistry,
) -> None:
    for tool, args in calls_naming("n" * 300):
        answer = await registry.execute(tool, args)
        assert answer.startswith(f"Error executing {tool}:"), answer
        assert "is too long (at most 255 bytes per name" in answer, answer


async def test_unicode_look_alike_dots_are_plain_names(
    registry: ToolRegistry, workspace: Workspace, layout: Layout
) -> None:
    for dots in ("\u2024\u2024", "\uff0e\uff0e", "\u2025", ".\u200b."):
        path = f"{dots}/{dots}/{dots}/sentinel/canary.txt"
        answer = await registry.execute("write_file", {"path": path, "content": "inside"})
        assert answer.startswith("Wrote 6 bytes"), answer
        assert (workspace.root / path).read_text() == "inside"
        assert SECRET not in await registry.execute("read_file", {"path": path})


# -- argument problems -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("tool", "args", "message"),
    [
        ("read_file", {"path": 7}, "'path': Input should be a valid string"),
        ("read_file", {}, "'path': Field required"),
        ("read_file", {"path": "a", "mode": "rb"}, "'mode': unknown parameter"),
        ("write_file", {"path": "a"}, "'content': Field required"),
        ("write_file", {"path": "a", "content": ["x"]}, "'content': Input should be"),
        ("move", {"source": "a"}, "'destination': Field required"),
        ("read_file", "[1, 2]", "expected a JSON object"),
        ("read_file", '{"path": ', "not valid JSON"),
    ],
)
async def test_wrong_arguments_are_named(
    registry: ToolRegistry, tool: str, args: dict[str, object] | str, message: str
) -> None:
    await assert_arguments_refused(registry, tool, args, message)


async def test_nul_bytes_in_paths_are_refused_by_every_tool(registry: ToolRegistry) -> None:
    for tool, args in NUL_PATH_CALLS:
        answer = await registry.execute(tool, args)
        assert "contains a NUL byte" in answer, (tool, answer)


async def test_content_with_a_lone_surrogate_is_refused(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    answer = await registry.execute("write_file", '{"path": "s.txt", "content": "ab\\ud800"}')
    assert "unpaired surrogate at character 2" in answer
    assert not (workspace.root / "s.txt").exists()


# -- list_dir ----------------------------------------------------------------------------------


async def test_list_dir_tells_directories_files_and_links_apart(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "src").mkdir()
    (workspace.root / "b.txt").write_text("12345")
    (workspace.root / "a.md").write_text("")
    (workspace.root / "link").symlink_to("src")
    os.mkfifo(workspace.root / "pipe")
    assert await registry.execute("list_dir", {}) == (
        ". (5 entries):\na.md (0 bytes)\nb.txt (5 bytes)\nlink -> src\n"
        "pipe (a named pipe (FIFO))\nsrc/"
    )
    assert await registry.execute("list_dir", {"path": "src"}) == "src is empty."
    assert await registry.execute("list_dir", {"path": "link"}) == "src is empty."


async def test_list_dir_of_a_file_or_nothing(registry: ToolRegistry, workspace: Workspace) -> None:
    (workspace.root / "f.txt").write_text("x")
    assert "'f.txt' is a file, not a directory" in await registry.execute(
        "list_dir", {"path": "f.txt"}
    )
    assert "'gone' does not exist" in await registry.execute("list_dir", {"path": "gone"})


async def test_a_huge_directory_listing_is_capped(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    for number in range(300):
        (workspace.root / f"{'long-name-' * 23}{number:03}.txt").touch()
    answer = await registry.execute("list_dir", {})
    assert fits_the_cap(answer)
    assert answer.startswith(". (300 entries):\n")
    assert_cut_short(answer, ".txt (0 bytes)", 300, "entries")


# -- mkdir -------------------------------------------------------------------------------------


async def test_mkdir_makes_parents_and_accepts_existing(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    assert await registry.execute("mkdir", {"path": "a/b/c"}) == "Created directory a/b/c/."
    assert (workspace.root / "a" / "b" / "c").is_dir()
    assert await registry.execute("mkdir", {"path": "a/b/c"}) == "Directory a/b/c/ already exists."
    assert await registry.execute("mkdir", {"path": "."}) == "Directory ./ already exists."


async def test_mkdir_through_a_file_is_refused(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "f").write_text("x")
    answer = await registry.execute("mkdir", {"path": "f/g"})
    assert answer == "Error executing mkdir: 'f' is a file, not a directory"


# -- remove ------------------------------------------------------------------------------------


async def test_remove_files_and_directories(registry: ToolRegistry, workspace: Workspace) -> None:
    (workspace.root / "tree" / "deep").mkdir(parents=True)
    (workspace.root / "tree" / "deep" / "x.txt").write_text("x")
    (workspace.root / "file.txt").write_text("x")
    assert await registry.execute("remove", {"path": "file.txt"}) == "Removed file.txt."
    assert await registry.execute("remove", {"path": "tree"}) == (
        "Removed directory tree/ and everything in it."
    )
    assert list(workspace.root.iterdir()) == []
    assert await registry.execute("remove", {"path": "tree"}) == (
        "Nothing to remove: tree does not exist."
    )
    assert await registry.execute("remove", {"path": "no/such/thing"}) == (
        "Nothing to remove: no/such/thing does not exist."
    )


@pytest.mark.parametrize("path", [".", "", "./", "a/..", "/", "ROOT", "ROOT/", "ROOT/a/.."])
async def test_remove_refuses_the_workspace_root(
    registry: ToolRegistry, workspace: Workspace, path: str
) -> None:
    (workspace.root / "a").mkdir()
    (workspace.root / "keep.txt").write_text("kept")
    path = path.replace("ROOT", str(workspace.root))
    answer = await registry.execute("remove", {"path": path})
    assert answer.startswith("Error executing remove:"), answer
    assert (workspace.root / "keep.txt").read_text() == "kept"


async def test_a_name_like_an_option_is_just_a_name(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "-rf").write_text("x")
    (workspace.root / "other.txt").write_text("kept")
    assert await registry.execute("remove", {"path": "-rf"}) == "Removed -rf."
    assert [p.name for p in workspace.root.iterdir()] == ["other.txt"]


async def test_removing_a_link_leaves_its_target(
    registry: ToolRegistry, workspace: Workspace, layout: Layout
) -> None:
    (workspace.root / "out").symlink_to(layout.sentinel)
    assert "leads outside" in await registry.execute("remove", {"path": "out/canary.txt"})
    answer = await registry.execute("remove", {"path": "out"})
    assert answer == "Removed symbolic link out (its target was left alone)."
    assert not (workspace.root / "out").is_symlink()


# -- move --------------------------------------------------------------------------------------


async def test_move_renames_and_moves_into_directories(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "a.txt").write_text("a")
    (workspace.root / "box").mkdir()
    assert await registry.execute("move", {"source": "a.txt", "destination": "b.txt"}) == (
        "Moved a.txt to b.txt."
    )
    assert await registry.execute("move", {"source": "b.txt", "destination": "box"}) == (
        "Moved b.txt to box/b.txt."
    )
    assert await registry.execute("move", {"source": "box", "destination": "x/y/renamed"}) == (
        "Moved box to x/y/renamed."
    )
    assert (workspace.root / "x" / "y" / "renamed" / "b.txt").read_text() == "a"


async def test_move_replaces_a_file(registry: ToolRegistry, workspace: Workspace) -> None:
    (workspace.root / "new.txt").write_text("new")
    (workspace.root / "old.txt").write_text("old")
    await registry.execute("move", {"source": "new.txt", "destination": "old.txt"})
    assert (workspace.root / "old.txt").read_text() == "new"


@pytest.mark.parametrize(
    ("source", "destination", "message"),
    [
        ("dir", "dir/sub", "cannot move directory 'dir' into itself ('dir/sub/dir')"),
        ("dir", "dir/sub/new", "cannot move directory 'dir' into itself ('dir/sub/new')"),
        ("dir", ".", "'dir' is already there; nothing to move"),
        ("missing", "dir", "'missing' does not exist"),
        (".", "dir", "the workspace root itself cannot be moved"),
        ("dir", "file.txt", "'dir' is a directory and 'file.txt' is not"),
        ("dir", "full", "'full/dir' is a directory that is not empty"),
        ("file.txt", "full/dir", "'full/dir/file.txt' is a directory and 'file.txt' is not"),
    ],
)
async def test_move_refusals(
    registry: ToolRegistry, workspace: Workspace, source: str, destination: str, message: str
) -> None:
    (workspace.root / "dir" / "sub").mkdir(parents=True)
    (workspace.root / "full" / "dir" / "file.txt").mkdir(parents=True)
    (workspace.root / "file.txt").write_text("kept")
    answer = await registry.execute("move", {"source": source, "destination": destination})
    assert answer.startswith("Error executing move:") and message in answer, answer
    assert (workspace.root / "dir" / "sub").is_dir()
    assert (workspace.root / "file.txt").read_text() == "kept"


async def test_move_keeps_everything_inside(
    registry: ToolRegistry, workspace: Workspace, layout: Layout
) -> None:
    (workspace.root / "a.txt").write_text("a")
    (workspace.root / "out").symlink_to(layout.sentinel)
    for source, destination in (
        ("a.txt", "../a.txt"),
        ("a.txt", "out"),
        ("a.txt", "out/a.txt"),
        ("../sentinel/canary.txt", "stolen.txt"),
        ("out/canary.txt", "stolen.txt"),
        (str(layout.sentinel), "stolen"),
    ):
        answer = await registry.execute("move", {"source": source, "destination": destination})
        assert "outside the workspace" in answer, answer
    assert (workspace.root / "a.txt").read_text() == "a"
    assert await registry.execute("move", {"source": "out", "destination": "link"}) == (
        "Moved out to link."
    )
    assert (workspace.root / "link").resolve() == layout.sentinel


async def test_odd_names_are_shown_on_one_line_as_valid_text(
    registry: ToolRegistry, workspace: Workspace
) -> None:
    (workspace.root / "two\nlines.txt").write_text("x")
    with open(os.path.join(os.fsencode(workspace.root), b"latin-\xe9.txt"), "wb") as file:
        file.write(b"x")
    answer = await registry.execute("list_dir", {})
    assert answer == ". (2 entries):\nlatin-\\xe9.txt (1 byte)\ntwo\\nlines.txt (1 byte)"
    found = await registry.execute("search_files", {"pattern": "*.txt"})
    assert found == "latin-\\xe9.txt\ntwo\\nlines.txt"
