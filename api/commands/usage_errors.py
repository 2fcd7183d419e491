"""A command line Click refuses (an unknown option, a bad value, a missing argument), said the
way toolq says every error: one line, ``error: ...`` on stderr (Click's own are three, the usage,
a hint and ``Error: ...``)."""

from __future__ import annotations

import io
import sys
from typing import NoReturn, Protocol, TextIO, cast

import typer


class CommandLineError(Protocol):
    """What toolq uses of Click's exception for a command line it refuses."""

    exit_code: int

    def format_message(self) -> str: ...

    def show(self, file: TextIO | None = None) -> None: ...


#: That exception's class: typer's copy of Click's or Click's own, by typer's version; the
#: ``BadParameter`` typer exports derives from it either way.
COMMAND_LINE_ERROR = cast(
    type[Exception],
    next(base for base in typer.BadParameter.__mro__ if base.__name__ == "ClickException"),
)


def exit_refused(exc: Exception) -> NoReturn:
    """One line on stderr, ``error: ...`` and where the command's options are shown, then exit
    with Click's status for it (2). A bare ``toolq`` shows the help, as Click shows it."""
    refused = cast(CommandLineError, exc)
    context = getattr(exc, "ctx", None)
    if type(exc).__name__ == "NoArgsIsHelpError" or context is None:
        shown = io.StringIO()
        refused.show(file=shown)
        for line in shown.getvalue().splitlines():
            if line.startswith("Error: "):
                line = "error: " + line.removeprefix("Error: ")
            print(line, file=sys.stderr)
    else:
        message = refused.format_message().rstrip(".")
        print(f"error: {message} ({context.command_path} -h shows its options)", file=sys.stderr)
    sys.exit(refused.exit_code)
