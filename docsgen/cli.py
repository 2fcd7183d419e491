"""The ``toolq`` command's reference, read from the Typer app: every command with its usage, its
help and each argument and option as ``--help`` shows it."""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import cast

import typer

from docsgen.tables import cell, prose, table


@dataclass(frozen=True)
class Parameter:
    """An argument or option of a command, as its ``--help`` shows it."""

    name: str
    #: How it is written: ``-o, --output <path>``, ``--stream``, ``PROMPT``.
    written: str
    help: str
    is_argument: bool


@dataclass(frozen=True)
class Command:
    name: str
    usage: str
    help: str
    parameters: tuple[Parameter, ...]


def commands(app: typer.Typer, program: str = "toolq") -> list[Command]:
    """Every command of ``app``, the group's own options first (as ``program`` itself)."""
    group = cast(typer.core.TyperGroup, typer.main.get_command(app))  # an app of commands
    root = typer.Context(group, info_name=program)
    found = [
        Command(program, f"{program} [OPTIONS] COMMAND", _help(group.help), _params(group, root))
    ]
    for name in _command_names(group, root):
        command = cast(typer.core.TyperCommand, group.commands[name])
        if command.hidden:
            continue
        context = typer.Context(command, info_name=name, parent=root)
        params = _params(command, context)
        arguments = " ".join(p.written for p in params if p.is_argument)
        usage = f"{program} {name} [OPTIONS]" + (f" {arguments}" if arguments else "")
        found.append(Command(f"{program} {name}", usage, _help(command.help), params))
    return found


def markdown(app: typer.Typer, program: str = "toolq") -> str:
    """The reference page's body: a section per command."""
    parts: list[str] = []
    for command in commands(app, program):
        parts += [
            f"## `{command.name}`",
            "",
            f"```text\n{command.usage}\n```",
            "",
            prose(command.help),
            "",
        ]
        if command.parameters:
            rows = [(f"`{p.written}`", cell(p.help)) for p in command.parameters]
            parts += [table(("argument or option", "what it does"), rows), ""]
    return "\n".join(parts)


def _command_names(group: typer.core.TyperGroup, context: typer.Context) -> list[str]:
    # The order the commands were declared in, which groups them as the app does.
    return list(group.commands) or group.list_commands(context)


def _params(
    command: typer.core.TyperCommand | typer.core.TyperGroup, context: typer.Context
) -> tuple[Parameter, ...]:
    found: list[Parameter] = []
    for param in [*command.params, command.get_help_option(context)]:
        if param is None or getattr(param, "hidden", False):
            continue
        record = param.get_help_record(context)
        is_argument = isinstance(param, typer.core.TyperArgument)
        if is_argument:
            written = (param.name or "").upper()
            help_text = record[1] if record else ""
        elif record is None:
            continue
        else:
            written, help_text = record
        found.append(Parameter(param.name or written, written, help_text, is_argument))
    return tuple(found)


def _help(text: str | None) -> str:
    """A command's help as its docstring says it, its paragraphs kept."""
    return inspect.cleandoc(text or "").replace("\b\n", "")
