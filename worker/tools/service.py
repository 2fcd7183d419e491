"""Service operations: files in and out of a run's workspace, and commands with their own argv,
input and output limit, for callers that prepare and inspect runs (batch tasks, sandboxes).

They are tools like the others, so they go through the queue with the same deadlines and
at-most-once rules, but models never see them: their names start with ``toolq.``, which no
model-facing tool name can, and the fleet publishes them with ``for_model`` false. Their answers
are the JSON of their typed answers (``worker.contract.operations``); a path that cannot be used is
an answer (``{"ok": false, "error": ..., "message": ...}``) the caller can act on, not a tool
error.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import os
import stat
from abc import abstractmethod
from typing import Any, ClassVar, Generic, Literal, TypeVar

from worker.contract import operations
from worker.contract.limits import MAX_LISTED_RUNS
from worker.contract.operations import (
    CollectedFile,
    CollectFilesAnswer,
    CollectFilesRequest,
    Content,
    ExecAnswer,
    ExecRequest,
    FileProblem,
    FileRefusal,
    ListWorkspacesAnswer,
    ListWorkspacesRequest,
    NoArguments,
    Operation,
    OperationRequest,
    PutFilesAnswer,
    PutFilesRefusal,
    PutFilesRequest,
    ReadFileAnswer,
    ReadFileRequest,
    RemoveWorkspaceAnswer,
    WireAnswer,
)
from worker.exceptions import PathNotFoundError, WorkspaceError
from worker.retention import remove_held, run_ids
from worker.sandbox import SandboxConfig
from worker.sessions.holders import RunSessions
from worker.tools.bash import run_limited, with_applied_limits, working_directory
from worker.tools.commands import run_command
from worker.tools.globs import Glob, glob_walk
from worker.tools.interface import ExecutableTool, JsonAnswerTool
from worker.tools.paths import shown
from worker.tools.runtime import current_runtime
from worker.tools.workspace import Workspace

RequestT = TypeVar("RequestT", bound=OperationRequest)


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


class OperationTool(JsonAnswerTool, Generic[RequestT]):
    """A tool that serves one service operation: its name, pool and arguments are the
    operation's, and it answers with one of the operation's answers."""

    operation: ClassVar[Operation[Any, Any, Any]]
    caps_own_output = True
    for_model = False
    reads_context = False

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "operation" in vars(cls):
            cls.name, cls.pool = cls.operation.name, cls.operation.pool
            cls.Args = cls.operation.request

    def execute(self, args: dict[str, Any]) -> dict[str, Any]:
        return self.serve(self.operation.request.model_validate(args)).wire()

    @abstractmethod
    def serve(self, request: RequestT) -> WireAnswer:
        """Carry out the operation; a refusal is an answer, any other failure raises."""


class ServiceTool(OperationTool[RequestT]):
    """A service operation on the current run's workspace."""

    idempotent = True

    def __init__(
        self, workspace: Workspace, transfer_max_bytes: int, sandbox: SandboxConfig
    ) -> None:
        self.workspace = workspace
        self.transfer_max_bytes = transfer_max_bytes
        self._sandbox = sandbox


class PutFilesTool(ServiceTool[PutFilesRequest]):
    operation = operations.PUT_FILES
    description = "Write files into the run's workspace, replacing any that exist."
    workspace_effect = "adds"

    def serve(self, request: PutFilesRequest) -> PutFilesAnswer | PutFilesRefusal:
        contents = {path: decode_content(c, shown(path)) for path, c in request.files.items()}
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
                return PutFilesRefusal(
                    error=self._unwritable(path), message=str(exc), written=written
                )
            written[path] = len(data)
        return PutFilesAnswer(written=written)

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


class ReadWholeFileTool(ServiceTool[ReadFileRequest]):
    operation = operations.READ_FILE
    description = "Read one whole file of the run's workspace, as base64."

    def serve(self, request: ReadFileRequest) -> ReadFileAnswer | FileRefusal:
        path = request.path
        limit = min(request.max_bytes or self.transfer_max_bytes, self.transfer_max_bytes)
        try:
            target = self.workspace.resolve(path)
            found = self.workspace.lstat(target)
            if found is None:
                return _refusal("not_found", f"{shown(path)} does not exist")
            if stat.S_ISDIR(found.st_mode):
                return _refusal("is_a_directory", f"{shown(path)} is a directory")
            if not stat.S_ISREG(found.st_mode):
                return _refusal("not_a_regular_file", f"{shown(path)} is not a regular file")
            with self.workspace.open_for_reading(target) as (file, info):
                if info.st_size > limit:
                    return _refusal(
                        "too_large",
                        f"{shown(path)} has {info.st_size:,} bytes, more than the {limit:,} "
                        "this read may take",
                    )
                data = file.read(limit + 1)
        except PathNotFoundError as exc:
            return _refusal("not_found", str(exc))
        except WorkspaceError as exc:  # outside the workspace, or changed while it was opened
            return _refusal("refused", str(exc))
        if len(data) > limit:  # grew while it was read
            return _refusal("too_large", f"{shown(path)} has more than {limit:,} bytes")
        return ReadFileAnswer(size=len(data), base64=base64.b64encode(data).decode("ascii"))


class CollectFilesTool(ServiceTool[CollectFilesRequest]):
    operation = operations.COLLECT_FILES
    description = "The regular files whose paths match globs, each cut at a size."

    def serve(self, request: CollectFilesRequest) -> CollectFilesAnswer:
        globs = [Glob.parse(pattern) for pattern in request.patterns]
        cap = min(request.max_file_bytes, self.transfer_max_bytes)
        matched = sorted(
            os.path.join(rel, name)
            for rel, fd, name, is_dir in glob_walk(self.workspace, self.workspace.root, globs)
            if not is_dir and _is_regular_at(fd, name)
        )
        files: dict[str, CollectedFile] = {}
        for path in matched[: request.max_files]:
            try:
                with self.workspace.open_for_reading(self.workspace.resolve(path)) as (f, info):
                    data = f.read(cap)
            except WorkspaceError:
                continue  # removed or swapped for something else since the walk saw it
            content, encoding = encode_content(data, cut=info.st_size > len(data))
            files[path] = CollectedFile(
                content=content,
                encoding=encoding,
                size=info.st_size,
                truncated=info.st_size > len(data),
            )
        return CollectFilesAnswer(files=files, matched=len(matched))


class RemoveWorkspaceTool(ServiceTool[NoArguments]):
    operation = operations.REMOVE_WORKSPACE
    description = "Remove the run's whole workspace, unless another call of the run is in flight."
    workspace_effect = "frees"  # measured after: a quota mark goes with the workspace

    def serve(self, request: NoArguments) -> RemoveWorkspaceAnswer:
        runtime = current_runtime()
        if runtime.workspace_lock is None:
            raise RuntimeError("a workspace is removed only by a worker's call, which holds it")
        root = runtime.workspace.root
        # The run is over: its shells end first, and nothing of them is left on this host.
        RunSessions(self._sandbox, root, idle_s=1).end_all()
        kept = remove_held(root.parent, root.name, runtime.workspace_lock)
        return RemoveWorkspaceAnswer(removed=kept is None, kept=kept)


class ListWorkspacesTool(ServiceTool[ListWorkspacesRequest]):
    operation = operations.LIST_WORKSPACES
    description = "The other runs with a workspace beside this run's, by the start of their ids."

    def serve(self, request: ListWorkspacesRequest) -> ListWorkspacesAnswer:
        root = self.workspace.root
        runs = [run for run in run_ids(root.parent, request.prefix) if run != root.name]
        return ListWorkspacesAnswer(runs=runs[:MAX_LISTED_RUNS], matched=len(runs))


class ExecTool(ServiceTool[ExecRequest]):
    """A command in the sandbox, as run_bash runs one, with an argv, input and caps of its own."""

    operation = operations.EXEC
    description = "Run a program in the sandbox with its own argv, input and output limit."
    idempotent = False
    timeout_argument = "timeout_ms"
    workspace_effect = "adds"

    def serve(self, request: ExecRequest) -> ExecAnswer:
        argv, command, stdin = request.argv, request.command, request.input
        if (argv is None) == (command is None):
            raise ValueError("give exactly one of 'argv' and 'command'")
        cwd = working_directory(self.workspace, request.cwd)
        cap = min(request.output_cap_bytes, self.transfer_max_bytes)
        # The run's own limits hold here as for run_bash (Inspect's exec, a batch's setup).
        config, timeout_ms = run_limited(self._sandbox, request.timeout_ms)
        result = run_command(
            argv if argv is not None else command or "",
            cwd=cwd,
            home=self.workspace.root,
            env=request.env,
            timeout_ms=timeout_ms,
            config=dataclasses.replace(config, output_cap_bytes=cap),
            stdin=decode_content(stdin, "input") if stdin is not None else None,
            identity=self.workspace.owner,
        )
        answer = with_applied_limits(result, config, timeout_ms)
        return ExecAnswer.model_validate(dict(answer))


def service_tools(
    workspace: Workspace, sandbox: SandboxConfig, transfer_max_bytes: int
) -> list[ExecutableTool]:
    """Every service operation on a run's workspace, for a worker's registry."""
    return [
        PutFilesTool(workspace, transfer_max_bytes, sandbox),
        ReadWholeFileTool(workspace, transfer_max_bytes, sandbox),
        CollectFilesTool(workspace, transfer_max_bytes, sandbox),
        RemoveWorkspaceTool(workspace, transfer_max_bytes, sandbox),
        ListWorkspacesTool(workspace, transfer_max_bytes, sandbox),
        ExecTool(workspace, transfer_max_bytes, sandbox),
    ]


def _refusal(kind: FileProblem, message: str) -> FileRefusal:
    return FileRefusal(error=kind, message=message)


def _is_regular_at(dir_fd: int, name: str) -> bool:
    """A regular file, not followed if it is a symbolic link: artifacts are the run's own files."""
    try:
        return stat.S_ISREG(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False
