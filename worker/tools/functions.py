"""Tools made of plain functions: the schema from the signature and the docstring, or as given.

``@tool`` (or ``tool(fn, ...)``) turns a function into a tool. Without ``parameters`` the schema
comes from the type hints (pydantic builds the arguments' model) and each parameter's
description from the docstring (Google, NumPy, reST or Epydoc style). With ``parameters`` the
JSON Schema is taken as given: it is checked against its meta-schema now, and every call's
arguments are checked against it. Either way the function is called with keyword arguments and
its return value is answered like a class tool's: text as it is, anything else as JSON.
"""

from __future__ import annotations

import inspect
import json
import re
import typing
from collections.abc import Callable
from typing import Any, ClassVar, TypedDict, Unpack, overload

import docstring_parser
import jsonschema
from jsonschema.exceptions import SchemaError
from jsonschema.protocols import Validator
from pydantic import BaseModel, ConfigDict, Field, PydanticUserError, create_model

from worker.contract.wire import Pool, function_tool
from worker.tools.interface import ExecutableTool, ToolArgs, check_against_model, parameters_schema

#: What the chat APIs accept as a tool's name.
TOOL_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ToolTraits(TypedDict, total=False):
    """What ``tool`` and ``ToolRegistry.register_function`` may be told besides the function."""

    #: The tool's name; the function's own by default.
    name: str
    #: What the model reads; the docstring's text (without its parameter list) by default.
    description: str
    #: A JSON Schema of the arguments, used as given; derived from the signature by default.
    parameters: dict[str, Any]
    #: Which worker pool runs it (in a plugin): ``tools`` unless it runs untrusted commands.
    pool: Pool
    #: Safe to run again after a worker died mid-call.
    idempotent: bool
    #: Offered to the model unless the caller says otherwise.
    enabled_by_default: bool
    #: The call's deadline when the caller gives none; ``TOOLQ_DEFAULT_TIMEOUT_MS`` by default.
    timeout_ms: int
    #: False: the function never reads the conversation (``current_context()``), and its calls
    #: carry none. True by default.
    reads_context: bool


class FunctionTool(ExecutableTool):
    """A function as a tool: called with the validated arguments as keywords. Calling the tool
    itself calls the function, so a decorated function still works as one."""

    def __init__(self, function: Callable[..., Any]) -> None:
        self.function = function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.function(*args, **kwargs)

    def execute(self, args: dict[str, Any]) -> Any:
        return self.function(**args)

    @classmethod
    def check_arguments(cls, args: dict[str, Any]) -> dict[str, Any] | list[str]:
        checked = check_against_model(cls.Args, args)
        if isinstance(checked, list):
            return checked
        # The values as validated (a model stays a model, a date a date), not dumped to dicts.
        return {name: getattr(checked, name) for name in type(checked).model_fields}


class AsyncFunctionTool(FunctionTool):
    """A coroutine function as a tool: awaited on the caller's event loop."""

    async def execute(self, args: dict[str, Any]) -> Any:
        return await self.function(**args)


class _AnyArguments(BaseModel):
    model_config = ConfigDict(extra="allow")


class JsonSchemaTool(FunctionTool):
    """A function whose arguments are described, and checked, by a JSON Schema as given."""

    Args = _AnyArguments
    parameters: ClassVar[dict[str, Any]]
    validator: ClassVar[Validator]

    def get_schema(self) -> dict[str, Any]:
        return function_tool(self.name, self.description, json.loads(json.dumps(self.parameters)))

    @classmethod
    def check_arguments(cls, args: dict[str, Any]) -> dict[str, Any] | list[str]:
        problems = [p for error in cls.validator.iter_errors(args) for p in _problems(error)]
        if problems:
            return problems
        defaults = {
            name: spec["default"]
            for name, spec in cls.parameters.get("properties", {}).items()
            if isinstance(spec, dict) and "default" in spec and name not in args
        }
        return {**json.loads(json.dumps(defaults)), **args}


class AsyncJsonSchemaTool(JsonSchemaTool):
    async def execute(self, args: dict[str, Any]) -> Any:
        return await self.function(**args)


@overload
def tool(function: Callable[..., Any], /, **traits: Unpack[ToolTraits]) -> FunctionTool: ...


@overload
def tool(
    function: None = None, /, **traits: Unpack[ToolTraits]
) -> Callable[[Callable[..., Any]], FunctionTool]: ...


def tool(
    function: Callable[..., Any] | None = None, /, **traits: Unpack[ToolTraits]
) -> FunctionTool | Callable[[Callable[..., Any]], FunctionTool]:
    """Make a tool of a plain function: ``@tool``, ``@tool(name=...)`` or ``tool(fn, ...)``.

    Raises ``TypeError`` or ``ValueError``, naming the tool, when the function cannot be
    described to a model: a parameter without a type hint, ``*args``, no description, a type
    with no JSON Schema, a ``parameters`` schema that is not valid JSON Schema.
    """
    if function is None:
        return lambda fn: tool(fn, **traits)
    if isinstance(function, ExecutableTool):
        raise TypeError(f"{type(function).__name__} is a tool already: register it as it is")
    name = traits.get("name") or str(getattr(function, "__name__", ""))
    if not TOOL_NAME.match(name):
        raise ValueError(
            f"{name!r} cannot name a tool: use 1 to 64 letters, digits, '_' or '-' (name=...)"
        )
    docs = docstring_parser.parse(inspect.getdoc(function) or "")
    description = traits.get("description") or "\n\n".join(
        part for part in (docs.short_description, docs.long_description) if part
    )
    if not description:
        raise ValueError(f"tool {name!r} needs a description: give it a docstring or description=")
    attributes: dict[str, Any] = {
        "name": name,
        "description": description,
        "pool": traits.get("pool", "tools"),
        "idempotent": traits.get("idempotent", False),
        "enabled_by_default": traits.get("enabled_by_default", True),
        "default_timeout_ms": traits.get("timeout_ms"),
        "reads_context": traits.get("reads_context", True),
    }
    is_async = inspect.iscoroutinefunction(function)
    base: type[FunctionTool]
    if "parameters" in traits:
        attributes.update(_schema_attributes(name, function, traits["parameters"]))
        base = AsyncJsonSchemaTool if is_async else JsonSchemaTool
    else:
        descriptions = {p.arg_name: p.description for p in docs.params if p.description}
        attributes["Args"] = _arguments_model(name, function, descriptions)
        base = AsyncFunctionTool if is_async else FunctionTool
    made: type[FunctionTool] = type(f"{base.__name__}_{name}", (base,), attributes)
    return made(function)


def as_tool(candidate: ExecutableTool | Callable[..., Any]) -> ExecutableTool:
    """A tool as it is, a plain function made one with ``tool``."""
    if isinstance(candidate, ExecutableTool):
        return candidate
    if isinstance(candidate, type) and issubclass(candidate, ExecutableTool):
        raise TypeError(f"{candidate.__name__} is a tool class: pass an instance, {candidate}()")
    if not callable(candidate):
        raise TypeError(f"a tool or a function is needed, not {type(candidate).__name__}")
    return tool(candidate)


def _arguments_model(
    name: str, function: Callable[..., Any], descriptions: dict[str, str]
) -> type[BaseModel]:
    """The model of ``function``'s parameters: types from its hints, defaults, descriptions."""
    hints = typing.get_type_hints(function, include_extras=True)
    fields: dict[str, Any] = {}
    for parameter in inspect.signature(function).parameters.values():
        where = f"tool {name!r}: parameter {parameter.name!r}"
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            raise TypeError(f"{where} takes any number of values: name each one instead")
        if parameter.kind is parameter.POSITIONAL_ONLY:
            raise TypeError(f"{where} is positional-only: tools are called with keywords")
        if parameter.name not in hints:
            raise TypeError(f"{where} has no type hint, so the model cannot be told its type")
        default = ... if parameter.default is parameter.empty else parameter.default
        description = descriptions.get(parameter.name)
        fields[parameter.name] = (hints[parameter.name], Field(default, description=description))
    try:
        model: type[BaseModel] = create_model(f"{name}_arguments", __base__=ToolArgs, **fields)
        parameters_schema(model)
    except (PydanticUserError, NameError) as exc:
        raise TypeError(f"tool {name!r}: its parameters cannot be described: {exc}") from exc
    return model


def _schema_attributes(
    name: str, function: Callable[..., Any], parameters: dict[str, Any]
) -> dict[str, Any]:
    """The checked schema and its validator: a mistake shows now, not at the model's call."""
    where = f"tool {name!r}: parameters"
    try:
        as_json = json.loads(json.dumps(parameters, allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{where} cannot be written as JSON: {exc}") from None
    if not isinstance(as_json, dict) or as_json.get("type") != "object":
        raise ValueError(f'{where} must describe an object: {{"type": "object", ...}}')
    kind = jsonschema.validators.validator_for(as_json, default=jsonschema.Draft202012Validator)
    try:
        kind.check_schema(as_json)
    except SchemaError as exc:
        at = "/".join(str(p) for p in exc.absolute_path) or "the top level"
        raise ValueError(f"{where} is not a valid JSON Schema at {at}: {exc.message}") from None
    try:
        inspect.signature(function).bind_partial(**dict.fromkeys(as_json.get("properties", {})))
    except TypeError as exc:
        raise TypeError(f"{where}: the function cannot take them: {exc}") from None
    return {"parameters": as_json, "validator": kind(as_json)}


def _problems(error: jsonschema.ValidationError) -> list[str]:
    """One schema violation as ``'parameter': reason``, in the words the class tools use for a
    missing or unknown parameter."""
    where = ".".join(str(p) for p in error.absolute_path)
    instance, schema = error.instance, error.schema
    if error.validator == "required" and isinstance(instance, dict):
        required = error.validator_value if isinstance(error.validator_value, list) else []
        return [f"{_joined(where, p)!r}: Field required" for p in required if p not in instance]
    if error.validator == "additionalProperties" and isinstance(instance, dict):
        schema = schema if isinstance(schema, dict) else {}
        known = set(schema.get("properties", {}))
        patterns = [re.compile(p) for p in schema.get("patternProperties", {})]
        unknown = [k for k in instance if k not in known and not any(p.search(k) for p in patterns)]
        if unknown:
            return [f"{_joined(where, k)!r}: unknown parameter" for k in unknown]
    return [f"{where or 'arguments'!r}: {error.message}"]


def _joined(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name
