"""``toolq`` as an Inspect AI sandbox environment: each sample gets a run workspace on the fleet,
its commands run in the sandbox pool with run_bash's isolation, its files go in and out through
the tools pool.

Inspect finds the class through the ``inspect_ai`` entry point of the toolq package, so
``inspect eval task.py --sandbox toolq`` (or ``sandbox="toolq"`` in a ``Task``) is all it takes.
Every command runs as the run's own unprivileged user; ``exec(user=...)`` is refused with
``SandboxUserUnsupportedError``, which Inspect's own tools take as "use the default user". A
task that names an image (``sandbox=("toolq", "python:3.12-slim")``, see ``image_config``) gets
a container of it for each sample, started before the sample and ended after it.
"""

from __future__ import annotations

import logging
import sys
from typing import Any, Literal, overload

from inspect_ai.log import transcript
from inspect_ai.util import (
    ExecResult,
    SandboxEnvironment,
    SandboxEnvironmentConfigType,
    SandboxEnvironmentLimits,
    SandboxUserUnsupportedError,
    sandboxenv,
)
from pydantic import BaseModel

from api.exceptions import FileProblemError, ImageUnavailable, ServiceCallError
from api.inspect_sandbox.cleanup import clean_up
from api.inspect_sandbox.contract import call_error, exec_outcome, file_error
from api.inspect_sandbox.image_config import CONFIG_FILES, ToolqSandboxConfig, sandbox_config
from api.inspect_sandbox.link import LINK
from api.inspect_sandbox.outside import SHELL, read_outside, write_outside
from api.inspect_sandbox.owners import new_run_id
from api.inspect_sandbox.sandbox_tools import (
    GVISOR,
    HAS_A_LOADER,
    NOT_FOUND,
    no_loader,
    starts_a_server,
)
from api.runs.environment import RunEnvironment
from api.runs.workspace import RunWorkspace, calls_end_within_s
from api.settings import OrchestratorSettings

log = logging.getLogger(__name__)

#: Runs the command in ``$1`` (relative to the workspace, or absolute) with the program looked up
#: on the sandbox's PATH, after ``env`` is applied; a program that cannot be run is the shell's
#: exit 126 or 127, as Inspect expects, rather than a failed call. ``-P``: a relative directory is
#: entered as it is, without the path to the workspace the sandbox user may not search. The
#: command is the shell's child, not its replacement: the first process of the sandbox's PID
#: namespace is its init, which the kernel spares every signal it did not ask for.
_IN_DIRECTORY = 'cd -P -- "$1" || exit; shift; "$@"'
#: Room left under the fleet's longest deadline for the worker to answer after a command ends.
_ANSWER_ROOM_MS = 1000
#: What a file transfer is given per MiB it may move, on top of the fleet's default deadline.
_TRANSFER_MS_PER_MIB = 1000


@sandboxenv(name="toolq")
class ToolqSandboxEnvironment(SandboxEnvironment):
    """One sample's sandbox: the run workspace ``workspace.run_id`` on the toolq fleet."""

    def __init__(
        self,
        workspace: RunWorkspace,
        settings: OrchestratorSettings,
        environment: RunEnvironment | None = None,
    ) -> None:
        super().__init__()
        self.workspace = workspace
        self._settings = settings
        #: The sample's container, when the task names an image (``image_config``).
        self.environment = environment

    # -- lifecycle ----------------------------------------------------------------------------

    @classmethod
    def config_files(cls) -> list[str]:
        return list(CONFIG_FILES)

    @classmethod
    def config_deserialize(cls, config: dict[str, Any]) -> BaseModel:
        return ToolqSandboxConfig(**config)

    @classmethod
    async def task_init(cls, task_name: str, config: SandboxEnvironmentConfigType | None) -> None:
        options = sandbox_config(config)  # a bad configuration stops the task before any sample
        await LINK.open()
        settings = LINK.settings
        refused = settings.network_refusal(options.network) or (
            options.limits and settings.limits_refusal(options.limits)
        )
        if refused:  # as a bad configuration: before any sample runs
            # Inspect calls no task_cleanup for a task whose task_init raised: let go here, or
            # the link would stay open on this fleet for the process's next eval.
            await LINK.close()
            raise ValueError(refused)

    @classmethod
    async def sample_init(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, metadata: dict[str, str]
    ) -> dict[str, SandboxEnvironment]:
        options = sandbox_config(config)
        dispatcher = await LINK.dispatcher()
        run_id = new_run_id(task_name, LINK.owner)
        workspace = RunWorkspace(dispatcher, LINK.fleet, run_id)
        if options.network != "none":  # every call of the sample's run carries it
            dispatcher.networks[run_id] = options.network
        if options.limits is not None:  # and its own limits
            dispatcher.limits[run_id] = options.limits
        environment = None
        if options.image is not None:
            environment = RunEnvironment(
                dispatcher,
                LINK.fleet,
                run_id,
                options.image,
                user=options.user,
                env=options.env,
                recreate=options.recreate,
            )
            try:
                started = await environment.start()
            except ImageUnavailable as exc:
                raise RuntimeError(str(exc)) from None
            transcript().info({"run_id": run_id, **started.as_record()}, source="toolq")
        return {"default": cls(workspace, LINK.settings, environment)}

    @classmethod
    async def sample_cleanup(
        cls,
        task_name: str,
        config: SandboxEnvironmentConfigType | None,
        environments: dict[str, SandboxEnvironment],
        interrupted: bool,
    ) -> None:
        for environment in environments.values():
            sandbox = environment.as_type(cls)
            workspace = sandbox.workspace
            dispatcher = await LINK.dispatcher()
            dispatcher.networks.pop(workspace.run_id, None)
            dispatcher.limits.pop(workspace.run_id, None)
            if sandbox.environment is not None:
                await sandbox.environment.end()
            try:
                # A command the sample left running (it was interrupted) ends by its deadline.
                await workspace.remove(wait_s=calls_end_within_s(sandbox._settings))
            except (ServiceCallError, FileProblemError) as exc:
                log.warning("could not remove the workspace of run %s: %s", workspace.run_id, exc)

    @classmethod
    async def task_cleanup(
        cls, task_name: str, config: SandboxEnvironmentConfigType | None, cleanup: bool
    ) -> None:
        if not cleanup:
            print(
                f"toolq: the workspaces of {task_name}'s samples are kept (no sandbox cleanup); "
                "`inspect sandbox cleanup toolq` removes them, `inspect sandbox cleanup toolq "
                "<run id>` one (each sample's transcript names its run)",
                file=sys.stderr,
            )
        await LINK.close()

    @classmethod
    async def cli_cleanup(cls, id: str | None) -> None:
        """``inspect sandbox cleanup toolq [RUN_ID]``: the workspaces of evals that no longer
        run, or the one of ``id`` (see ``api.inspect_sandbox.cleanup``)."""
        await LINK.open()
        try:
            cleaned = await clean_up(LINK, id)
        except ValueError as exc:
            print(f"error: {exc}", file=sys.stderr)
            raise SystemExit(2) from None
        finally:
            await LINK.close()
        print(cleaned.report())

    # -- commands -----------------------------------------------------------------------------

    async def exec(
        self,
        cmd: list[str],
        input: str | bytes | None = None,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        user: str | None = None,
        timeout: int | None = None,  # noqa: ASYNC109 (Inspect's interface)
        timeout_retry: bool = True,
        concurrency: bool = True,
    ) -> ExecResult[str]:
        # timeout_retry is not needed: a toolq timeout is the command's own, stopped by the
        # worker, never a transport that hung. concurrency is the fleet's to bound.
        if user is not None:
            raise SandboxUserUnsupportedError(
                f"the toolq sandbox cannot run commands as {user!r}: every command runs as "
                "the sandbox user of the run (a uid of its own; with an image, the image's "
                "user or the configuration's), so leave user unset"
            )
        if not cmd:
            raise ValueError("exec needs a command: cmd is empty")
        timeout_ms = self._command_deadline_ms(timeout)
        if starts_a_server(cmd) and self._keeps_sessions():
            # Inspect's sandbox tools (bash_session(), ...) keep their sessions in a server that
            # must outlive this exec, which is what a toolq exec never lets a command do: it
            # starts in the run's kept shell session instead, in the same box (the run's
            # container, where it has an image), for the run.
            return await self._start_sandbox_tools(cmd, cwd, env, timeout_ms)
        try:
            result = await self.workspace.run(
                [SHELL, "-c", _IN_DIRECTORY, "sh", cwd or ".", *cmd],
                input=input,
                env=env,
                timeout_ms=timeout_ms,
                output_cap_bytes=SandboxEnvironmentLimits.MAX_EXEC_OUTPUT_SIZE,
            )
        except ServiceCallError as exc:
            raise call_error(exc, f"the command {cmd[0]!r}") from exc
        # Which worker ran it, in the sample's transcript: the sandbox is a fleet, not one box.
        transcript().info(
            {
                "run_id": self.workspace.run_id,
                "worker": result.worker,
                "exit_code": result.exit_code,
                "duration_ms": result.duration_ms,
            },
            source="toolq",
        )
        return exec_outcome(result, cmd, timeout_ms / 1000)

    def _keeps_sessions(self) -> bool:
        """The run's box holds shell sessions: all but a gVisor container (``runsc``), whose
        sessions are refused. There Inspect's server lives for its exec alone, as a command's
        leftovers do: its tools that need none (text_editor()) still work."""
        started = self.environment.started if self.environment is not None else None
        return started is None or not started.runtime.startswith(GVISOR)

    async def _start_sandbox_tools(
        self, cmd: list[str], cwd: str | None, env: dict[str, str] | None, timeout_ms: int
    ) -> ExecResult[str]:
        try:
            kept = await self.workspace.keep_running(cmd, cwd=cwd, env=env, timeout_ms=timeout_ms)
        except ServiceCallError as exc:
            raise call_error(exc, f"the command {cmd[0]!r}") from exc
        started = exec_outcome(kept, cmd, timeout_ms / 1000)
        if started.returncode == NOT_FOUND and self.environment is not None:
            # The launcher Inspect has just written is there: what is not is its loader.
            probe = await self.exec([SHELL, "-c", HAS_A_LOADER])
            if not probe.success:
                return ExecResult(False, NOT_FOUND, "", no_loader(self.environment.image))
        return started

    def _command_deadline_ms(self, timeout: int | None) -> int:
        """Inspect's timeout, within the fleet's longest deadline (which also bounds a command
        given none)."""
        longest = max(self._settings.max_timeout_ms - _ANSWER_ROOM_MS, _ANSWER_ROOM_MS)
        if timeout is None:
            return longest
        return max(min(int(timeout * 1000), longest), 1)

    # -- files --------------------------------------------------------------------------------

    async def write_file(self, file: str, contents: str | bytes) -> None:
        size = (
            len(contents.encode("utf-8", "surrogatepass"))
            if isinstance(contents, str)
            else len(contents)
        )
        deadline_ms = self._transfer_deadline_ms(size)
        try:
            await self.workspace.put_files({file: contents}, timeout_ms=deadline_ms)
        except FileProblemError as exc:
            if exc.kind != "refused":
                raise file_error(exc, file) from exc
            await write_outside(self.workspace, file, contents, deadline_ms)
        except ServiceCallError as exc:
            raise call_error(exc, f"writing {file!r}") from exc

    @overload
    async def read_file(self, file: str, text: Literal[True] = True) -> str: ...

    @overload
    async def read_file(self, file: str, text: Literal[False]) -> bytes: ...

    async def read_file(self, file: str, text: bool = True) -> str | bytes:
        limit = SandboxEnvironmentLimits.MAX_READ_FILE_SIZE
        deadline_ms = self._transfer_deadline_ms(limit)
        try:
            data = await self.workspace.read_file(file, max_bytes=limit, timeout_ms=deadline_ms)
        except FileProblemError as exc:
            if exc.kind != "refused":
                raise file_error(exc, file) from exc
            data = await read_outside(self.workspace, file, limit, deadline_ms)
        except ServiceCallError as exc:
            raise call_error(exc, f"reading {file!r}") from exc
        # Strict UTF-8, as Inspect documents (UnicodeDecodeError); newlines kept as they are.
        return data.decode("utf-8") if text else data

    def _transfer_deadline_ms(self, size: int) -> int:
        """The fleet's default deadline, and time for the bytes: they cross the broker as base64
        in JSON, a few MiB a second on a busy machine."""
        allowance = size * _TRANSFER_MS_PER_MIB // 2**20
        return min(self._settings.default_timeout_ms + allowance, self._settings.max_timeout_ms)
