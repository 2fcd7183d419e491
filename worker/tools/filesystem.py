"""File tools: read, write, list, make, remove and move paths inside the workspace."""

from __future__ import annotations

import codecs
import os
import stat
from typing import Any

from pydantic import Field

from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, answer_budget, cap_in_words, fit_utf8
from worker.exceptions import PathNotFoundError, WorkspaceError
from worker.tools.interface import ExecutableTool, ToolArgs, TruncatedText
from worker.tools.paths import counted, file_kind, printable, shown
from worker.tools.workspace import Workspace

#: How much of a file is checked for NUL bytes to tell binary from text.
BINARY_PROBE_BYTES = 8192


class WorkspaceTool(ExecutableTool):
    """A tool that works on the files of one workspace; what it may say a lot of, it cuts to
    fit ``output_cap_bytes`` itself, with a notice of what was left out. It works on files
    only, never on the conversation: its calls carry none."""

    reads_context = False

    def __init__(
        self, workspace: Workspace, *, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
    ) -> None:
        self.workspace = workspace
        self.output_cap_bytes = output_cap_bytes


# -- read_file ---------------------------------------------------------------------------------


class ReadFileArgs(ToolArgs):
    path: str = Field(description="The file to read, relative to the workspace, e.g. 'src/app.py'.")
    encoding: str = Field(
        "utf-8",
        description="The file's text encoding, e.g. 'utf-8', 'latin-1', 'cp1252' or 'utf-16'.",
    )


def _read_file_description(cap_bytes: int) -> str:
    return (
        "Read a text file in the workspace and return its contents. Files over "
        f"{cap_in_words(cap_bytes)} are cut to their first part, with a notice of the full "
        "size; binary files are refused."
    )


class ReadFileTool(WorkspaceTool):
    name = "read_file"
    description = _read_file_description(DEFAULT_OUTPUT_CAP_BYTES)
    Args = ReadFileArgs
    idempotent = True

    def __init__(
        self, workspace: Workspace, *, output_cap_bytes: int = DEFAULT_OUTPUT_CAP_BYTES
    ) -> None:
        super().__init__(workspace, output_cap_bytes=output_cap_bytes)
        # The model is told the cap this tool applies (TOOLQ_OUTPUT_CAP_BYTES), not the default.
        self.description = _read_file_description(output_cap_bytes)

    def execute(self, args: dict[str, Any]) -> str:
        codec = text_codec(args["encoding"])
        target = self.workspace.resolve(args["path"])
        where = self.workspace.relative(target)
        budget = answer_budget(self.output_cap_bytes)
        with self.workspace.open_for_reading(target) as (file, info):
            try:
                head = file.read(budget + 1)  # buffered: reads until it has as much, or the end
            except OSError as exc:
                raise self.workspace.error(exc, where) from None
        if not head:
            return f"({where} is empty: 0 bytes)"
        wide = codec.startswith(("utf-16", "utf-32"))  # their text is full of NUL bytes
        if not wide and b"\x00" in head[:BINARY_PROBE_BYTES]:
            raise WorkspaceError(
                f"{shown(where)} is a binary file ({info.st_size:,} bytes); read_file only "
                "shows text"
            )
        more_on_disk = len(head) > budget or info.st_size > len(head)
        text = _decode(head[:budget], codec, final=not more_on_disk, where=where)
        text, cut = fit_utf8(text, budget)
        if not (more_on_disk or cut):
            return text
        return TruncatedText(
            f"{text}\n\n[read_file: {where} has {info.st_size:,} bytes; only its first "
            f"{len(text):,} characters are shown because answers are capped at "
            f"{self.output_cap_bytes:,} bytes. Use search_text to find the lines you need.]"
        )


def text_codec(encoding: str) -> str:
    """The canonical name of a text encoding, or a clear error."""
    try:
        name = codecs.lookup(encoding).name
        b"x".decode(name, "ignore")  # refuses bytes-to-bytes codecs such as 'hex' (not b"")
    except (LookupError, ValueError, TypeError):
        raise ValueError(
            f"unknown text encoding {shown(encoding)}; use one such as 'utf-8', 'latin-1', "
            "'cp1252' or 'utf-16'"
        ) from None
    return name


def _decode(data: bytes, codec: str, *, final: bool, where: str) -> str:
    decoder = codecs.getincrementaldecoder(codec)(errors="strict")
    try:
        # Not final when the read stopped early, so a character cut in half at the end is
        # held back instead of reported as an error.
        return str(decoder.decode(data, final=final))
    except UnicodeDecodeError as exc:
        bad = data[exc.start : exc.start + 1].hex() if isinstance(exc.object, bytes) else "?"
        raise WorkspaceError(
            f"{shown(where)} is not valid {codec} text: byte 0x{bad} at offset {exc.start:,} "
            f"cannot be decoded ({exc.reason}). Try another encoding, e.g. encoding='latin-1' "
            "(reads any bytes) or 'cp1252'."
        ) from None
    except UnicodeError as exc:
        raise WorkspaceError(f"{shown(where)} cannot be decoded as {codec}: {exc}") from None


# -- write_file --------------------------------------------------------------------------------


class WriteFileArgs(ToolArgs):
    path: str = Field(
        description="The file to write, relative to the workspace; missing parent directories "
        "are created."
    )
    content: str = Field(description="The complete new text of the file, written as UTF-8.")


class WriteFileTool(WorkspaceTool):
    name = "write_file"
    description = (
        "Write text to a file in the workspace, replacing it if it exists and creating "
        "missing parent directories."
    )
    Args = WriteFileArgs
    workspace_effect = "adds"

    def only_shrinks(self, args: object) -> bool:
        """Overwriting a file of one link with no more bytes than it holds: a run past its quota
        can empty or cut its files with the tool that is on by default."""
        if not isinstance(args, dict):
            return False
        path, content = args.get("path"), args.get("content")
        if not isinstance(path, str) or not isinstance(content, str):
            return False
        try:
            found = os.stat(self.workspace.resolve(path))
        except (OSError, WorkspaceError):
            return False
        new_size = len(content.encode("utf-8", "surrogatepass"))
        return stat.S_ISREG(found.st_mode) and found.st_nlink == 1 and new_size <= found.st_size

    def execute(self, args: dict[str, Any]) -> str:
        path: str = args["path"]
        if path.endswith("/"):
            raise WorkspaceError(
                f"{shown(path)} ends with '/', which names a directory; give a file name such "
                "as 'notes/todo.txt'"
            )
        target = self.workspace.resolve(path)
        if self.workspace.is_root(target):
            raise WorkspaceError(f"{shown(path)} is the workspace root, a directory")
        content: str = args["content"]
        try:
            data = content.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ValueError(
                f"content has an unpaired surrogate at character {exc.start:,}, which cannot be "
                "written as UTF-8"
            ) from None
        self.workspace.write_file(target, data)
        return f"Wrote {counted(len(data), 'byte')} to {self.workspace.relative(target)}."


# -- list_dir ----------------------------------------------------------------------------------


class ListDirArgs(ToolArgs):
    path: str = Field(".", description="The directory to list, relative to the workspace.")


class ListDirTool(WorkspaceTool):
    name = "list_dir"
    description = (
        "List one directory of the workspace, sorted by name: directories end with '/', files "
        "show their size, symbolic links their target."
    )
    Args = ListDirArgs
    idempotent = True

    def execute(self, args: dict[str, Any]) -> str:
        target = self.workspace.resolve(args["path"])
        where = self.workspace.relative(target)
        entries = self.workspace.scan(target)
        if not entries:
            return f"{where} is empty."
        header = f"{where} ({counted(len(entries), 'entry', 'entries')}):"
        budget = answer_budget(self.output_cap_bytes) - len(header.encode())
        lines: list[str] = []
        for entry in entries:
            line = _describe(entry.name, entry.stat.st_mode, entry.stat.st_size, entry.link_target)
            budget -= len(line.encode("utf-8")) + 1
            if budget < 0:
                break
            lines.append(line)
        left_out = len(entries) - len(lines)
        if not left_out:
            return "\n".join([header, *lines])
        more = counted(left_out, "more entry", "more entries")
        lines.append(f"[{more} not shown: the answer is capped]")
        return TruncatedText("\n".join([header, *lines]))


def _describe(name: str, mode: int, size: int, link_target: str | None) -> str:
    name = printable(name)
    if stat.S_ISDIR(mode):
        return f"{name}/"
    if stat.S_ISREG(mode):
        return f"{name} ({counted(size, 'byte')})"
    if link_target is not None:
        return f"{name} -> {printable(link_target)}"
    return f"{name} ({file_kind(mode)})"


# -- mkdir -------------------------------------------------------------------------------------


class MkdirArgs(ToolArgs):
    path: str = Field(
        description="The directory to create, relative to the workspace; parents are created "
        "too, and an existing directory is fine."
    )


class MkdirTool(WorkspaceTool):
    name = "mkdir"
    description = "Create a directory in the workspace, with any missing parents (like mkdir -p)."
    Args = MkdirArgs
    idempotent = True
    workspace_effect = "adds"

    def execute(self, args: dict[str, Any]) -> str:
        target = self.workspace.resolve(args["path"])
        where = self.workspace.relative(target)
        if self.workspace.make_directories(target):
            return f"Created directory {where}/."
        return f"Directory {where}/ already exists."


# -- remove ------------------------------------------------------------------------------------


class RemoveArgs(ToolArgs):
    path: str = Field(
        description="The file or directory to remove, relative to the workspace; directories "
        "are removed with everything in them."
    )


class RemoveTool(WorkspaceTool):
    name = "remove"
    description = (
        "Remove a file or a directory (recursively) from the workspace. Removing something "
        "that does not exist is not an error. A symbolic link is removed, not its target."
    )
    Args = RemoveArgs
    enabled_by_default = False
    workspace_effect = "frees"

    def execute(self, args: dict[str, Any]) -> str:
        target = self.workspace.entry(args["path"])
        if self.workspace.is_root(target):
            raise WorkspaceError(
                f"refusing to remove {shown(args['path'])}: it is the workspace root itself; "
                "name something inside it"
            )
        where = self.workspace.relative(target)
        found = self.workspace.remove(target)
        if found is None:
            return f"Nothing to remove: {where} does not exist."
        if stat.S_ISDIR(found.st_mode):
            return f"Removed directory {where}/ and everything in it."
        if stat.S_ISLNK(found.st_mode):
            return f"Removed symbolic link {where} (its target was left alone)."
        return f"Removed {where}."


# -- move --------------------------------------------------------------------------------------


class MoveArgs(ToolArgs):
    source: str = Field(description="The file or directory to move, relative to the workspace.")
    destination: str = Field(
        description="The new path, relative to the workspace. If it is an existing directory, "
        "the source is moved into it; an existing file there is replaced."
    )


class MoveTool(WorkspaceTool):
    name = "move"
    description = (
        "Move or rename a file or directory inside the workspace (like mv): into the "
        "destination if it is an existing directory, else to that path."
    )
    Args = MoveArgs

    def execute(self, args: dict[str, Any]) -> str:
        ws = self.workspace
        source = ws.entry(args["source"])
        if ws.is_root(source):
            raise WorkspaceError("the workspace root itself cannot be moved")
        into = ws.resolve(args["destination"])
        existing = ws.lstat(into)
        if existing is not None and stat.S_ISDIR(existing.st_mode):
            destination = into / source.name
        else:
            destination = ws.entry(args["destination"])
        before, after = ws.relative(source), ws.relative(destination)
        if destination.is_relative_to(source):
            found = ws.lstat(source)
            if found is None:
                raise PathNotFoundError(f"{shown(before)} does not exist")
            if destination == source:
                raise WorkspaceError(f"{shown(before)} is already there; nothing to move")
            if stat.S_ISDIR(found.st_mode):
                raise WorkspaceError(
                    f"cannot move directory {shown(before)} into itself ({shown(after)})"
                )
        ws.rename(source, destination)
        return f"Moved {before} to {after}."
