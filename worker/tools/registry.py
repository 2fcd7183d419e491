"""The registry: which tools exist, which are enabled, and one ``execute`` that never raises."""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import logging
import threading
from collections.abc import Callable
from typing import Any, Unpack

from pydantic_core import PydanticSerializationError, to_jsonable_python

from worker.exceptions import DuplicateToolError, WorkspaceError
from worker.plumbing.log_context import current_context
from worker.tools.functions import FunctionTool, ToolTraits, tool
from worker.tools.interface import ExecutableTool, ProxyTool, ToolOutcome, TruncatedText

__all__ = ["DuplicateToolError", "ToolOutcome", "ToolRegistry"]

log = logging.getLogger(__name__)


class ToolRegistry:
    """Tools by name, in registration order, each enabled or not.

    ``passthrough`` names exceptions that must escape ``execute`` (a worker's time-limit signal);
    everything else a tool raises becomes a message for the model. ``sync_in_thread`` runs plain
    ``def`` tools in a thread so they never block the caller's event loop; a worker that runs one
    call at a time turns it off to save the thread hop.
    """

    def __init__(
        self, *, passthrough: tuple[type[BaseException], ...] = (), sync_in_thread: bool = True
    ) -> None:
        self._tools: dict[str, ExecutableTool] = {}
        self._enabled: dict[str, bool] = {}
        self._passthrough = passthrough
        self._sync_in_thread = sync_in_thread

    def register(self, tool: ExecutableTool) -> None:
        if not isinstance(tool, ExecutableTool):
            raise TypeError(
                f"register() takes a tool, not {type(tool).__name__}: for a plain function "
                "use register_function(fn) or decorate it with worker.tools.functions.tool"
            )
        if tool.name in self._tools:
            raise DuplicateToolError(f"A tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool
        self._enabled[tool.name] = True

    def register_function(
        self, function: Callable[..., Any], **traits: Unpack[ToolTraits]
    ) -> FunctionTool:
        """Register a plain function as a tool and return the tool: its schema derived from
        the type hints and the docstring, or ``parameters`` (a JSON Schema) as given. See
        ``worker.tools.functions.tool`` for ``traits``."""
        made = tool(function, **traits)
        self.register(made)
        return made

    def unregister(self, name: str) -> None:
        self._tools.pop(name, None)
        self._enabled.pop(name, None)

    def enable(self, name: str) -> None:
        self._require(name)
        self._enabled[name] = True

    def disable(self, name: str) -> None:
        self._require(name)
        self._enabled[name] = False

    def get(self, name: str) -> ExecutableTool | None:
        return self._tools.get(name)

    def get_enabled_schemas(self) -> list[dict[str, Any]]:
        return [t.get_schema() for n, t in self._tools.items() if self._enabled[n]]

    def get_tool_names(self) -> list[str]:
        return list(self._tools)

    def has_tool(self, name: str) -> bool:
        return name in self._tools

    def is_tool_enabled(self, name: str) -> bool:
        return self._enabled.get(name, False)

    def list_tools(self) -> list[dict[str, Any]]:
        return [
            {
                "name": name,
                "description": tool.description,
                "parameters": tool.get_schema()["function"]["parameters"],
                "enabled": self._enabled[name],
            }
            for name, tool in self._tools.items()
        ]

    async def execute(self, name: str, args: dict[str, Any] | str | None) -> str:
        """Run a tool and answer with text for the model; never raises."""
        return (await self.run(name, args)).output

    async def run(
        self,
        name: str,
        args: dict[str, Any] | str | None,
        *,
        tool_call_id: str | None = None,
        timeout_ms: int | None = None,
    ) -> ToolOutcome:
        """Like ``execute``, but tells a failure apart from an answer. ``tool_call_id`` is the
        model's id for the call, passed on to a tool that runs elsewhere.

        With ``timeout_ms`` a tool that runs here is answered as timed out at that deadline: a
        coroutine is cancelled; a plain function's thread cannot be stopped, so it is left to
        finish on its own (in a daemon thread, which holds up neither the caller nor the
        interpreter's exit) and its result is dropped. A tool that runs elsewhere keeps its own
        deadline."""
        tool = self._tools.get(name)
        if isinstance(tool, ProxyTool) and self._enabled[name]:
            return await tool.forward(args, tool_call_id)
        found = self._prepare(name, args)
        if isinstance(found, ToolOutcome):
            return found
        tool, validated = found
        try:
            async with asyncio.timeout(None if timeout_ms is None else timeout_ms / 1000) as limit:
                result = await self._call(tool, validated, by_deadline=timeout_ms is not None)
        except Exception as exc:
            # Only the deadline's own TimeoutError: one the tool raised is an error of the tool.
            if isinstance(exc, TimeoutError) and limit.expired():
                return ToolOutcome(
                    f"Error: {name} timed out after {timeout_ms} ms and was stopped.", "timeout"
                )
            return self._error_answer(name, exc)
        return serialise_result(name, result)

    def run_blocking(
        self, name: str, args: dict[str, Any] | str | None, loop: asyncio.AbstractEventLoop
    ) -> ToolOutcome:
        """``run`` for a caller that may block its thread, as a worker process does: a plain
        ``def`` tool is called directly, without the event loop's few dozen microseconds; a
        coroutine tool runs on ``loop``."""
        found = self._prepare(name, args)
        if isinstance(found, ToolOutcome):
            return found
        tool, validated = found
        try:
            result = tool.execute(validated)  # a coroutine tool's coroutine, run next
            if inspect.isawaitable(result):
                result = loop.run_until_complete(result)
        except Exception as exc:
            return self._error_answer(name, exc)
        return serialise_result(name, result)

    def _prepare(
        self, name: str, args: dict[str, Any] | str | None
    ) -> ToolOutcome | tuple[ExecutableTool, dict[str, Any]]:
        """The tool and its validated arguments, or the answer saying why it cannot run."""
        tool = self._tools.get(name)
        if tool is None:
            # Only what the model may call: naming a disabled tool would invite a call it
            # cannot make.
            known = ", ".join(n for n in self._tools if self._enabled[n]) or "none"
            return ToolOutcome(
                f"Error: tool {name!r} was not found. Available tools: {known}.", "unknown_tool"
            )
        if not self._enabled[name]:
            return ToolOutcome(
                f"Error: tool {name!r} is not available (it is disabled).", "tool_disabled"
            )
        validated = validate_arguments(tool, args)
        if isinstance(validated, str):
            return ToolOutcome(validated, "invalid_arguments")
        return tool, validated

    def _error_answer(self, name: str, exc: Exception) -> ToolOutcome:
        """The answer to tool ``name``, which raised ``exc``; an exception to pass through
        (``passthrough``) goes on to the caller instead.

        The traceback goes to the log with the call's ids, never with its arguments, which can
        hold whole files. A path the tool cannot use is the model's mistake, told to the model:
        logged in one line, without a traceback (formatting one costs milliseconds, and a model
        that guesses paths makes thousands)."""
        if isinstance(exc, self._passthrough):
            raise exc
        extra = {"tool": name, **current_context()}
        if isinstance(exc, WorkspaceError):
            log.info("tool %s refused a path: %s", name, type(exc).__name__, extra=extra)
        else:
            log.warning("tool %s raised %s", name, type(exc).__name__, exc_info=exc, extra=extra)
        message = str(exc) or type(exc).__name__
        return ToolOutcome(f"Error executing {name}: {message}", "tool_error")

    async def _call(self, tool: ExecutableTool, args: dict[str, Any], *, by_deadline: bool) -> Any:
        """``tool.execute(args)``; a plain function runs in a thread of its own when it has a
        deadline (``run_in_daemon_thread``), else in a pooled one (``sync_in_thread``) or here."""
        if inspect.iscoroutinefunction(tool.execute):
            result: Any = tool.execute(args)
        elif by_deadline:
            result = await run_in_daemon_thread(tool.execute, args)
        elif self._sync_in_thread:
            result = await asyncio.to_thread(tool.execute, args)
        else:
            result = tool.execute(args)
        return await result if inspect.isawaitable(result) else result

    def _require(self, name: str) -> None:
        if name not in self._tools:
            raise KeyError(f"No tool named {name!r} is registered")


def run_in_daemon_thread(function: Callable[..., Any], *args: Any) -> asyncio.Future[Any]:
    """``function(*args)`` in a thread of its own, as a future of the running loop.

    Unlike ``asyncio.to_thread``, nothing waits for the thread when its caller stops waiting
    (past a deadline): neither the loop's shutdown nor the interpreter's exit.
    """
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()
    context = contextvars.copy_context()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return  # the caller stopped waiting
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def work() -> None:
        outcome: tuple[Any, BaseException | None]
        try:
            outcome = (context.run(function, *args), None)
        except BaseException as exc:
            outcome = (None, exc)
        with contextlib.suppress(RuntimeError):  # the loop has closed: nobody is waiting
            loop.call_soon_threadsafe(settle, *outcome)

    threading.Thread(target=work, name="toolq-local-tool", daemon=True).start()
    return future


def validate_arguments(
    tool: ExecutableTool, raw: dict[str, Any] | str | None
) -> dict[str, Any] | str:
    """The validated arguments as a dict, or a message naming every parameter that failed."""
    args: Any
    if raw is None or (isinstance(raw, str) and not raw.strip()):
        args = {}
    elif isinstance(raw, str):
        try:
            args = json.loads(raw)
        except json.JSONDecodeError as exc:
            # Some of Python's messages end with "at" already ("Unterminated string starting at").
            at = "" if exc.msg.endswith(" at") else " at"
            return (
                f"Error: invalid arguments for {tool.name}: the arguments are not valid JSON "
                f"({exc.msg}{at} line {exc.lineno} column {exc.colno}). Send a JSON object."
            )
    else:
        args = raw
    if not isinstance(args, dict):
        return (
            f"Error: invalid arguments for {tool.name}: expected a JSON object, "
            f"got {type(args).__name__}."
        )
    checked = tool.check_arguments(args)
    if isinstance(checked, list):
        return f"Error: invalid arguments for {tool.name}: " + "; ".join(checked) + "."
    return checked


def serialise_result(name: str, result: Any) -> ToolOutcome:
    if isinstance(result, str):
        return ToolOutcome(str(result), truncated=isinstance(result, TruncatedText))
    try:
        return ToolOutcome(
            json.dumps(result, ensure_ascii=False, allow_nan=False, default=to_jsonable_python)
        )
    except (TypeError, ValueError, PydanticSerializationError) as exc:
        error = {
            "error": "unserializable_result",
            "tool": name,
            "message": f"{name} returned a {type(result).__name__} that cannot be "
            f"serialised to JSON: {exc}",
        }
        return ToolOutcome(json.dumps(error), "unserializable_result")
