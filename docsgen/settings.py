"""Every setting's reference, read from the settings classes: the variable, its type, its default
and the field's description, a table per class for the fields that class adds."""

from __future__ import annotations

import enum
import tempfile
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import SecretStr
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined
from pydantic_settings import BaseSettings

from api.settings import OrchestratorSettings
from docsgen.tables import cell, table
from worker.contract.settings import ENV_PREFIX, FleetSettings, WorkerSettings, setting_names

#: Each class with what it is for; each table shows the fields that class adds to the one above.
SETTINGS_CLASSES: tuple[tuple[type[BaseSettings], str], ...] = (
    (FleetSettings, "Shared by the whole fleet: workers and callers must agree on these."),
    (WorkerSettings, "Read by workers: their workspaces, tools and sandbox."),
    (
        OrchestratorSettings,
        "Read by the orchestrator: `toolq run`, `batch`, `serve` and agents workers.",
    ),
)


@dataclass(frozen=True)
class Setting:
    variable: str
    type: str
    default: str
    description: str


def settings_of(cls: type[BaseSettings]) -> list[Setting]:
    """The settings ``cls`` declares itself (not those of the class it extends)."""
    inherited: set[str] = set()
    for base in cls.__mro__[1:]:
        if isinstance(base, type) and issubclass(base, BaseSettings):
            inherited |= {name for name, _ in setting_names(base)}
    return [
        Setting(
            variable=f"{ENV_PREFIX}{name.upper()}",
            type=_type_name(field.annotation),
            default=_default(field),
            description=field.description or "",
        )
        for name, field in setting_names(cls)
        if name not in inherited
    ]


def every_variable() -> set[str]:
    """The variable of every field of every settings class."""
    return {
        f"{ENV_PREFIX}{name.upper()}"
        for cls, _ in SETTINGS_CLASSES
        for name, _ in setting_names(cls)
    }


def markdown() -> str:
    """The settings page's tables, a section per class."""
    parts: list[str] = []
    for cls, purpose in SETTINGS_CLASSES:
        parts += [f"## {cls.__name__}", "", purpose, ""]
        rows = [
            (f"`{s.variable}`", cell(s.type), cell(s.default), cell(s.description))
            for s in settings_of(cls)
        ]
        parts += [table(("variable", "type", "default", "meaning"), rows), ""]
    return "\n".join(parts)


def _default(field: FieldInfo) -> str:
    if field.default_factory is not None:
        value: Any = field.default_factory()  # type: ignore[call-arg]
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    if value is None:
        return "unset"
    if isinstance(value, list) and not value:
        return "empty"
    if isinstance(value, Path):
        # The temporary folder of the machine that built the docs is not the reader's.
        temp = Path(tempfile.gettempdir())
        if value.is_relative_to(temp):
            return f"`$TMPDIR/{value.relative_to(temp)}`"
    if isinstance(value, enum.Enum):
        value = value.value
    return f"`{value}`"


def _type_name(annotation: Any) -> str:
    """What a variable takes, in a reader's words: ``integer``, ``auto, json or text``, ..."""
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _type_name(args[0])
    if origin is Literal:
        names = [f"`{a}`" for a in args]
        return ", ".join(names[:-1]) + f" or {names[-1]}" if len(names) > 1 else names[0]
    if origin in (typing.Union, types.UnionType):
        kept = [a for a in args if a is not type(None)]
        return " or ".join(_type_name(a) for a in kept)
    if origin is list:
        return "comma-separated list"
    plain: dict[object, str] = {
        str: "string",
        int: "integer",
        float: "number",
        bool: "boolean",
        Path: "path",
        SecretStr: "secret string",
    }
    return plain.get(annotation) or str(getattr(annotation, "__name__", annotation))
