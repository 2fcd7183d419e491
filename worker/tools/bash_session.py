"""bash_session: a shell that stays for the run, under a pseudo-terminal, in the run's box.

Its arguments follow Inspect's ``bash_session()``: ``action`` (``type_submit`` types the input
and Enter and waits for the shell's prompt or for a program's output to settle; ``type``;
``read``; ``interrupt``, Ctrl-C; ``restart``), ``input`` and ``session``. The working folder,
variables, functions and background processes stay from one call to the next
(``worker.sessions``).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any, ClassVar

from pydantic import BaseModel, Field, model_validator

from worker.contract.limits import DEFAULT_OUTPUT_CAP_BYTES, cap_in_words
from worker.contract.settings import get_worker_settings
from worker.images.box_shells import BoxPlace, gvisor_refusal
from worker.images.calls import inside_path
from worker.images.owner import current_owner
from worker.sandbox import SandboxConfig
from worker.sessions.holders import MAX_SESSIONS_PER_RUN, RunSessions
from worker.sessions.wire import Action, HolderAnswer, HolderRequest
from worker.tools.bash import DEFAULT_TIMEOUT_MS, MAX_TIMEOUT_MS, SandboxCommandTool
from worker.tools.commands import run_box
from worker.tools.interface import ToolArgs
from worker.tools.runtime import (
    admit_current_call,
    current_environment,
    current_limits,
    current_network,
    report_holder,
)
from worker.tools.workspace import Workspace

#: The longest input one call types.
MAX_INPUT_CHARS = 65_536
SESSION_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"


class BashSessionArgs(ToolArgs):
    """Arguments of bash_session."""

    action: Action = Field(
        description="type_submit: type the input and Enter, then wait for the shell's prompt (or "
        "for an interactive program's output to settle); type: type the input alone (no "
        "Enter); read: what the terminal printed since the last call; interrupt: Ctrl-C; "
        "restart: end the shell and start a new one."
    )
    input: str | None = Field(
        None,
        max_length=MAX_INPUT_CHARS,
        description="The text to type (type_submit and type only).",
    )
    session: str = Field(
        "default",
        pattern=SESSION_PATTERN,
        description=f"The session's name: a run may keep up to {MAX_SESSIONS_PER_RUN} shells.",
    )
    timeout: int = Field(
        DEFAULT_TIMEOUT_MS,
        gt=0,
        le=MAX_TIMEOUT_MS,
        description="Milliseconds to wait for the prompt or for output. A command still running "
        "then keeps running; the answer says so.",
    )

    @model_validator(mode="after")
    def _input_fits_action(self) -> BashSessionArgs:
        typing_input = self.action in ("type_submit", "type")
        if typing_input and self.input is None:
            raise ValueError(f"action {self.action!r} needs an 'input' to type")
        if not typing_input and self.input is not None:
            raise ValueError(f"action {self.action!r} takes no 'input'")
        if self.input is not None and "\x00" in self.input:
            raise ValueError("the input contains a NUL byte, which a terminal cannot take")
        return self


def _description(cap_bytes: int) -> str:
    return (
        "A bash shell that stays for the whole run, under a terminal: the working folder, "
        "exported variables, functions and background processes (a server started in one call "
        "answers in the next) stay between calls; interactive programs (python3, a debugger) "
        "take input. Answers JSON with output (what the terminal printed since the last call, "
        f"its latest {cap_in_words(cap_bytes)} kept), running (a command has not finished: "
        "read again later, or interrupt), exit_code (of the last command, when the shell waits "
        "at its prompt). Several sessions by name. No network where the sandbox has a "
        "network namespace. Off unless enabled: offered only where the caller switched it on."
    )


class BashSessionTool(SandboxCommandTool):
    """Keeps a run's shells alive between calls, each under a pseudo-terminal in the run's box."""

    name = "bash_session"
    description = _description(DEFAULT_OUTPUT_CAP_BYTES)
    Args: ClassVar[type[BaseModel]] = BashSessionArgs

    def __init__(
        self, workspace: Workspace, config: SandboxConfig | None = None, idle_s: float | None = None
    ) -> None:
        if config is None or idle_s is None:
            settings = get_worker_settings()
            config = config if config is not None else SandboxConfig.from_settings(settings)
            idle_s = idle_s if idle_s is not None else settings.session_idle_s
        self._workspace = workspace
        self._config = config
        self._idle_s = idle_s
        self.description = _description(self._config.output_cap_bytes)

    def sessions(self) -> RunSessions:
        """The sessions of the call's run, under the run's own limits where it asked (in its
        box, where it has an image: the box's group holds them)."""
        home, environment = self._workspace.root, current_environment()
        box = None if environment is None else functools.partial(_box_place, home, environment)
        config = self._config.with_limits(current_limits())
        return RunSessions(config, home, self._idle_s, current_network(), box)

    def execute(self, args: dict[str, Any]) -> str:
        name, action = args.get("session", "default"), args["action"]
        timeout = args.get("timeout", DEFAULT_TIMEOUT_MS)
        sessions = self.sessions()
        cwd, identity = self._workspace.root, self._workspace.owner
        admit_current_call()
        report_holder(current_owner().queue)
        if action == "restart":
            sessions.restart(name, cwd=cwd, identity=identity)
            read = HolderRequest(action="read", wait_ms=timeout)
            answer = sessions.ask(name, read, cwd=cwd, identity=identity)
            return _answer(name, answer, timeout, restarted=True)
        request = HolderRequest(action=action, input=args.get("input") or "", wait_ms=timeout)
        return _answer(name, sessions.ask(name, request, cwd=cwd, identity=identity), timeout)


def _box_place(home: Path, environment: str) -> BoxPlace:
    """Where a session of the run whose workspace is ``home`` starts: its box, in its working
    folder. ``EnvironmentLost`` without one; one line where its runtime cannot hold one."""
    boxes, record = run_box(home, environment)
    refusal = gvisor_refusal(boxes.settings)
    if refusal is not None:
        raise ValueError(refusal)
    return BoxPlace(boxes.settings, record, inside_path(record, home))


def _answer(name: str, answer: HolderAnswer, timeout_ms: int, *, restarted: bool = False) -> str:
    body: dict[str, Any] = {
        "session": name,
        "output": answer.output,
        "running": answer.running,
        "exit_code": answer.exit_code,
        "truncated": answer.cut_bytes > 0,
    }
    notes = []
    if restarted:
        notes.append("a new shell started; nothing of the old one is kept")
    if answer.cut_bytes:
        notes.append(f"the first {answer.cut_bytes:,} bytes of output were cut; the latest kept")
    if answer.running:
        notes.append(
            "the shell is not back at its prompt: a command still runs (its time limit of "
            f"{timeout_ms:,} ms does not end it) or a program waits for input; 'read' shows what "
            "it prints next, 'interrupt' (Ctrl-C) or 'restart' ends it"
        )
    if answer.ended:
        notes.append("the shell has exited; 'restart' starts a new one")
    if notes:
        body["notice"] = "; ".join(notes)
    return json.dumps(body, ensure_ascii=False)
