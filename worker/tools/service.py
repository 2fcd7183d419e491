"""Service operations: files in and out of a run's workspace, and commands with their own argv,
input and output limit, for callers that prepare and inspect runs (batch tasks, sandboxes).

They are tools like the others, so they go through the queue with the same deadlines and
at-most-once rules, but models never see them: their names start with ``toolq.``, which no
model-facing tool name can, and the fleet publishes them with ``for_model`` false. Their answers
are JSON; a path that cannot be used is an answer (``{"ok": false, "error": ..., "message":
...}``) the caller can act on, not a tool error.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import stat
from typing import Any, Literal

from pydantic import Field, field_validator

from worker.images.commands import run_command
from worker.retention import remove_held, run_ids
from worker.sandbox import SandboxConfig
from worker.tools.bash import command_answer, working_directory
from worker.tools.interface import ExecutableTool, ToolArgs
from worker.tools.paths import PathNotFoundError, WorkspaceError, shown
from worker.tools.runtime import current_runtime
from worker.tools.search import Glob
from worker.tools.workspace import Workspace

#: The prefix of every service operation's name.
SERVICE_PREFIX = "toolq."
#: The most files one ``collect_files`` call returns.
MAX_COLLECTED_FILES = 100
#: The most run ids one ``list_workspaces`` call returns (with how many matched).
MAX_LISTED_RUNS = 10_000

Content = str | dict[str, str]
FileProblem = Literal["not_found", "is_a_directory", "not_a_regular_file", "too_large", "refused"]


def decode_content(content: Content, where: str) -> bytes:
    """A string is UTF-8 text; ``{"base64": "..."}`` is bytes."""
    if isinstance(content, str):
        return content.encode("utf-8", "surrogatepass")
    if set(content) != {"base64"}:
        raise ValueError(f"{where}: content must be a string or {{'base64': '...'}}")
    try:
        return base64.b64decode(content["base64"], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where}: the base64 content is not valid base64") from None


def encode_content(data: bytes, *, cut: bool = False) -> tuple[str, Literal["utf-8", "base64"]]:
    """Text when ``data`` is UTF-8, else base64: as a caller would want to show it.

    ``cut`` says ``data`` is the start of a longer file: a character the cut split in two is
    left out, so that a long text still comes back as text.
    """
    try:
        return data.decode("utf-8"), "utf-8"
    except UnicodeDecodeError as exc:
        if cut and exc.reason == "unexpected end of data":
            return data[: exc.start].decode("utf-8"), "utf-8"
        return base64.b64encode(data).decode("ascii"), "base64"


class ServiceTool(ExecutableTool):
    """A service operation on the current run's workspace."""

    idempotent = True
    caps_own_output = True
    for_model = False

    def __init__(self, workspace: Workspace, transfer_max_bytes: int) -> None:
        self.workspace = workspace
        self.transfer_max_bytes = transfer_max_bytes


class PutFilesArgs(ToolArgs):
    files: dict[str, Content] = Field(
        description='Workspace-relative path -> UTF-8 text, or {"base64": "..."} for bytes.'
    )


class PutFilesTool(ServiceTool):
    name = "toolq.put_files"
    description = "Write files into the run's workspace, replacing any that exist."
    Args = PutFilesArgs
    workspace_effect = "adds"

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        contents = {path: decode_content(c, shown(path)) for path, c in args["files"].items()}
        total = sum(len(data) for data in contents.values())
        if total > self.transfer_max_bytes:
            raise ValueError(
                f"{total:,} bytes in all is more than the {self.transfer_max_bytes:,} bytes one "
                "transfer may carry"
            )
        written: dict[str, int] = {}
        for path, data in contents.items():
            try:
                target = self.workspace.resolve(path)
                self.workspace.write_file(target, data)
            except WorkspaceError as exc:
                # Those before it stay written, and the answer says which they are.
                return {**_problem(self._unwritable(path), str(exc)), "written": written}
            written[path] = len(data)
        return {"ok": True, "written": written}

    def _unwritable(self, path: str) -> FileProblem:
        """Why ``path`` could not be written: what is there, or that it may not be used."""
        try:
            found = self.workspace.lstat(self.workspace.resolve(path))
        except WorkspaceError:
            return "refused"
        if found is not None and stat.S_ISDIR(found.st_mode):
            return "is_a_directory"
        if found is not None and not stat.S_ISREG(found.st_mode):
            return "not_a_regular_file"
        return "refused"


class ReadFileArgs(ToolArgs):
    path: str = Field(min_length=1, description="Workspace-relative path of a regular file.")
    max_bytes: int | None = Field(None, gt=0, description="Refuse a larger file.")


class ReadWholeFileTool(ServiceTool):
    name = "toolq.read_file"
    description = "Read one whole file of the run's workspace, as base64."
    Args = ReadFileArgs

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        path: str = args["path"]
        limit = min(args.get("max_bytes") or self.transfer_max_bytes, self.transfer_max_bytes)
        try:
            target = self.workspace.resolve(path)
            found = self.workspace.lstat(target)
            if found is None:
                return _problem("not_found", f"{shown(path)} does not exist")
            if stat.S_ISDIR(found.st_mode):
                return _problem("is_a_directory", f"{shown(path)} is a directory")
            if not stat.S_ISREG(found.st_mode):
                return _problem("not_a_regular_file", f"{shown(path)} is not a regular file")
            with self.workspace.open_for_reading(target) as (file, info):
                if info.st_size > limit:
                    return _problem(
                        "too_large",
                        f"{shown(path)} has {info.st_size:,} bytes, more than the {limit:,} "
                        "this read may take",
                    )
                data = file.read(limit + 1)
        except PathNotFoundError as exc:
            return _problem("not_found", str(exc))
        except WorkspaceError as exc:  # outside the workspace, or changed while it was opened
            return _problem("refused", str(exc))
        if len(data) > limit:  # grew while it was read
            return _problem("too_large", f"{shown(path)} has more than {limit:,} bytes")
        return {"ok": True, "size": len(data), "base64": base64.b64encode(data).decode("ascii")}


class CollectFilesArgs(ToolArgs):
    patterns: list[str] = Field(
        min_length=1, description="Workspace-relative globs, e.g. 'out/*.txt' or '**/*.json'."
    )
    max_files: int = Field(MAX_COLLECTED_FILES, gt=0, le=MAX_COLLECTED_FILES)
    max_file_bytes: int = Field(51_200, gt=0, description="Each file's content is cut here.")


class CollectFilesTool(ServiceTool):
    name = "toolq.collect_files"
    description = "The regular files whose paths match globs, each cut at a size."
    Args = CollectFilesArgs

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        globs = [Glob.parse(pattern) for pattern in args["patterns"]]
        cap = min(args["max_file_bytes"], self.transfer_max_bytes)
        matched = sorted(self._matching(globs))
        files: dict[str, dict[str, Any]] = {}
        for path in matched[: args["max_files"]]:
            try:
                with self.workspace.open_for_reading(self.workspace.resolve(path)) as (f, info):
                    data = f.read(cap)
            except WorkspaceError:
                continue  # removed or swapped for something else since the walk saw it
            content, encoding = encode_content(data, cut=info.st_size > len(data))
            files[path] = {
                "content": content,
                "encoding": encoding,
                "size": info.st_size,
                "truncated": info.st_size > len(data),
            }
        return {"ok": True, "files": files, "matched": len(matched)}

    def _matching(self, globs: list[Glob]) -> set[str]:
        found: set[str] = set()
        root = self.workspace.root
        states = {"": [glob.start() for glob in globs]}
        for rel, fd, dirs, names in self.workspace.walk(root):
            here = states.pop(rel)
            entered = []
            for name in dirs:
                below = [glob.step(s, name)[1] for glob, s in zip(globs, here, strict=True)]
                if any(below):
                    entered.append(name)
                    states[os.path.join(rel, name)] = below
            dirs[:] = entered
            for name in names:
                wanted = any(g.step(s, name)[0] for g, s in zip(globs, here, strict=True))
                if wanted and _is_regular_at(fd, name):
                    found.add(os.path.join(rel, name))
        return found


class RemoveWorkspaceTool(ServiceTool):
    name = "toolq.remove_workspace"
    description = "Remove the run's whole workspace, unless another call of the run is in flight."
    workspace_effect = "frees"  # measured after: a quota mark goes with the workspace

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        runtime = current_runtime()
        if runtime.workspace_lock is None:
            raise RuntimeError("a workspace is removed only by a worker's call, which holds it")
        root = runtime.workspace.root
        kept = remove_held(root.parent, root.name, runtime.workspace_lock)
        if kept is not None:
            return {"ok": True, "removed": False, "kept": kept}
        return {"ok": True, "removed": True}


class ListWorkspacesArgs(ToolArgs):
    prefix: str = Field(min_length=1, description="Only the runs whose ids start with this.")


class ListWorkspacesTool(ServiceTool):
    name = "toolq.list_workspaces"
    description = "The other runs with a workspace beside this run's, by the start of their ids."
    Args = ListWorkspacesArgs

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        root = self.workspace.root
        runs = [run for run in run_ids(root.parent, args["prefix"]) if run != root.name]
        return {"ok": True, "runs": runs[:MAX_LISTED_RUNS], "matched": len(runs)}


class ExecArgs(ToolArgs):
    argv: list[str] | None = Field(None, min_length=1, description="The program and arguments.")
    command: str | None = Field(None, min_length=1, description="Or a /bin/sh -c command line.")
    input: Content | None = Field(None, description="Standard input: text or {'base64': ...}.")
    cwd: str | None = Field(None, description="Workspace-relative directory; default the root.")
    env: dict[str, str] = Field(default_factory=dict)
    timeout_ms: int = Field(30_000, gt=0)
    output_cap_bytes: int = Field(
        51_200, gt=0, description="Each stream keeps this many bytes, then a notice of the cut."
    )

    @field_validator("argv")
    @classmethod
    def _no_nul(cls, argv: list[str] | None) -> list[str] | None:
        if argv and any("\x00" in part for part in argv):
            raise ValueError("an argument contains a NUL byte, which no command line can hold")
        return argv


class ExecTool(ServiceTool):
    """A command in the sandbox, as run_bash runs one, with an argv, input and caps of its own."""

    name = "toolq.exec"
    description = "Run a program in the sandbox with its own argv, input and output limit."
    Args = ExecArgs
    pool = "sandbox"
    idempotent = False
    timeout_argument = "timeout_ms"
    workspace_effect = "adds"

    def __init__(
        self, workspace: Workspace, transfer_max_bytes: int, sandbox: SandboxConfig
    ) -> None:
        super().__init__(workspace, transfer_max_bytes)
        self._sandbox = sandbox

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        argv, command = args.get("argv"), args.get("command")
        if (argv is None) == (command is None):
            raise ValueError("give exactly one of 'argv' and 'command'")
        stdin = args.get("input")
        cwd = working_directory(self.workspace, args.get("cwd"))
        cap = min(args["output_cap_bytes"], self.transfer_max_bytes)
        result = run_command(
            argv if argv is not None else command or "",
            cwd=cwd,
            home=self.workspace.root,
            env=args["env"],
            timeout_ms=args["timeout_ms"],
            config=dataclasses.replace(self._sandbox, output_cap_bytes=cap),
            stdin=decode_content(stdin, "input") if stdin is not None else None,
            identity=self.workspace.owner,
        )
        return {"ok": True, **command_answer(result).model_dump(exclude_none=True)}


def service_tools(
    workspace: Workspace, sandbox: SandboxConfig, transfer_max_bytes: int
) -> list[ExecutableTool]:
    """Every service operation, for a worker's registry."""
    return [
        PutFilesTool(workspace, transfer_max_bytes),
        ReadWholeFileTool(workspace, transfer_max_bytes),
        CollectFilesTool(workspace, transfer_max_bytes),
        RemoveWorkspaceTool(workspace, transfer_max_bytes),
        ListWorkspacesTool(workspace, transfer_max_bytes),
        ExecTool(workspace, transfer_max_bytes, sandbox),
    ]


def _problem(kind: FileProblem, message: str) -> dict[str, Any]:
    return {"ok": False, "error": kind, "message": message}


def _is_regular_at(dir_fd: int, name: str) -> bool:
    """A regular file, not followed if it is a symbolic link: artifacts are the run's own files."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
