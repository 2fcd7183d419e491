"""The base class every tool derives from: a name, a description, typed arguments, an execute."""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast

from pydantic import BaseModel, ConfigDict, ValidationError

from worker.contract.errors import ErrorKind
from worker.contract.wire import Pool, ResourceUsage, function_tool


@dataclass(frozen=True, slots=True)
class ToolOutcome:
    """What one call produced: the text for the model and, for a failure, its kind.

    A tool run elsewhere also says where it ran and for how long.
    """

    output: str
    error_kind: ErrorKind | None = None
    worker: str | None = None
    duration_ms: float | None = None
    #: The tool left part of its answer out to fit the output cap.
    truncated: bool = False
    #: What the call's command used (run_bash), as its worker measured it.
    usage: ResourceUsage | None = None

    @property
    def is_error(self) -> bool:
        return self.error_kind is not None


class TruncatedText(str):
    """An answer its tool cut to fit the output cap, with a notice of what was left out: the
    call's result says it was truncated."""

    __slots__ = ()


class ToolArgs(BaseModel):
    """Base of a tool's arguments: a parameter the tool does not have is refused, not ignored."""

    model_config = ConfigDict(extra="forbid")


class NoArgs(ToolArgs):
    """Arguments of a tool that takes none."""


class ExecutableTool(ABC):
    """A tool the model can call.

    Subclasses set ``name``, ``description`` and ``Args`` (a pydantic model, usually a
    ``ToolArgs``; omit it for a tool without parameters) and implement ``execute``, plain or
    ``async``. ``execute`` receives the validated arguments as a plain ``dict`` with defaults
    filled in, and returns a ``str`` (a ``TruncatedText`` when it cut its answer to the output
    cap) or any value the registry can serialise to JSON.

    The traits the fleet publishes of a tool (``ToolSpec``: name, description, pool, idempotent,
    enabled_by_default, default_timeout_ms, timeout_argument, for_model, reads_context) are set
    on the class or on an instance: a proxy of a fleet's tool carries those of the spec it was
    made from, one class for every such tool.
    """

    name: str
    description: str
    Args: ClassVar[type[BaseModel]] = NoArgs

    #: Which worker pool runs the tool: ``sandbox`` is for tools that run untrusted commands.
    pool: Pool = "tools"
    #: Safe to run twice: a call interrupted mid-run (its worker died) is run again only if True.
    idempotent: bool = False
    #: The tool calls ``worker.tools.runtime.admit_current_call`` itself, just before its effects
    #: start (run_bash, as its command is handed over): the executor runs it without waiting for
    #: the call's start marker, whose round trip then overlaps the tool's own preparation.
    admits_itself: ClassVar[bool] = False
    #: Offered to the model unless the caller says otherwise; False makes the tool opt-in (the
    #: default factory registers it disabled, and the fleet's manifest says so).
    enabled_by_default: bool = True
    #: The tool caps its own output (and keeps it valid JSON); the generic text cap is skipped.
    caps_own_output: ClassVar[bool] = False
    #: Deadline applied when the caller gives none, in milliseconds; None: the fleet's default
    #: (``TOOLQ_DEFAULT_TIMEOUT_MS``).
    default_timeout_ms: int | None = None
    #: An argument that sets the tool's own time limit in ms (run_bash's ``timeout``): the call's
    #: deadline then follows it, so the tool can stop itself and report before the worker must.
    timeout_argument: str | None = None
    #: Offered to models; False for service operations that only callers use (worker/tools/
    #: service.py): the Agent, the API's tool list and the MCP server leave them out.
    for_model: bool = True
    #: The tool reads the conversation (``worker.tools.context``: its messages, the system
    #: prompt). False: its calls carry none, where a long run would send every message it has
    #: with each call. True unless a tool says otherwise, since any tool may read it.
    reads_context: bool = True
    #: What the tool does to the run's workspace, for its quota (``worker.quota``): ``adds``
    #: (refused while the run is past its quota; the workspace is measured after), ``frees``
    #: (measured after, never refused) or ``none``.
    workspace_effect: ClassVar[Literal["none", "adds", "frees"]] = "none"

    def only_shrinks(self, args: object) -> bool:
        """Whether this call of a tool that ``adds`` can only make the workspace smaller: it runs
        even past the quota, as the way out of it."""
        return False

    @abstractmethod
    def execute(self, args: dict[str, Any]) -> Any | Awaitable[Any]:
        """Run the tool with validated arguments."""

    def with_notice(self, output: str, notice: str) -> str:
        """``output`` with a notice from the worker (the workspace is past its quota) added in
        the answer's own form: a line of its own here, a field for tools that answer JSON."""
        return f"{output}\n[{notice}]"

    def get_schema(self) -> dict[str, Any]:
        """The OpenAI tool definition, derived from ``Args``, with this tool's description (a
        tool may word its own from its settings: read_file and run_bash name their cap)."""
        return function_tool(self.name, self.description, parameters_schema(self.Args))

    @classmethod
    def check_arguments(cls, args: dict[str, Any]) -> dict[str, Any] | list[str]:
        """The arguments ``execute`` receives, or every problem as ``'parameter': reason``."""
        checked = check_against_model(cls.Args, args)
        return checked if isinstance(checked, list) else checked.model_dump()


class JsonAnswerTool(ExecutableTool):
    """A tool that answers with a JSON object: a notice from the worker is a field of it."""

    def with_notice(self, output: str, notice: str) -> str:
        try:
            answer = json.loads(output)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):  # an error, in words
            return super().with_notice(output, notice)
        return json.dumps({**answer, "notice": notice}, ensure_ascii=False)


class ProxyTool(ExecutableTool):
    """A tool that runs elsewhere (on a worker): it takes the call as the model made it and
    answers with a ``ToolOutcome``; the registry neither validates nor serialises for it."""

    @abstractmethod
    async def forward(
        self, arguments: dict[str, Any] | str | None, tool_call_id: str | None
    ) -> ToolOutcome:
        """Run the call where the tool lives and answer for it; never raises for its failures."""

    async def execute(self, args: dict[str, Any]) -> str:
        return (await self.forward(args, None)).output


def check_against_model(model: type[BaseModel], args: dict[str, Any]) -> BaseModel | list[str]:
    """``args`` validated by ``model``, or every problem, each naming its parameter."""
    problems: list[str] = []
    if model.model_config.get("extra") != "allow":
        known = {f.alias or n for n, f in model.model_fields.items()} | set(model.model_fields)
        problems.extend(f"{k!r}: unknown parameter" for k in args if k not in known)
    try:
        validated = model.model_validate(args)
    except ValidationError as exc:
        for err in exc.errors(include_url=False):
            where = ".".join(str(p) for p in err["loc"]) or "arguments"
            if err["type"] == "extra_forbidden":
                continue  # already named above, in the same words for every tool
            problems.append(f"{where!r}: {err['msg']}")
        return problems
    return problems or validated


_SCHEMA_CACHE: dict[type[BaseModel], dict[str, Any]] = {}


def parameters_schema(model: type[BaseModel]) -> dict[str, Any]:
    """JSON Schema for a model's fields, in the plain form every provider accepts.

    Generating a schema costs far more than a tool call, so it is made once per model.
    """
    cached = _SCHEMA_CACHE.get(model)
    if cached is None:
        schema = model.model_json_schema()
        schema.pop("title", None)
        for field in schema.get("properties", {}).values():
            field.pop("title", None)
        schema.setdefault("properties", {})
        schema["additionalProperties"] = False
        cached = _SCHEMA_CACHE[model] = schema
    return cast(dict[str, Any], _copy(cached))


def _copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value
