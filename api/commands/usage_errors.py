"""A command line Click refuses (an unknown option, a bad value, a missing argument), said the
way toolq says every error line: ``error: ...`` on stderr (Click's own line starts ``Error:``)."""

from __future__ import annotations

import io
import sys
from typing import NoReturn, Protocol, TextIO, cast

import typer


class CommandLineError(Protocol):
    """What toolq uses of Click's exception for a command line it refuses."""

    exit_code: int

    def show(self, file: TextIO | None = None) -> None: ...


#: That exception's class: typer's copy of Click's or Click's own, by typer's version; the
#: ``BadParameter`` typer exports derives from it either way.
COMMAND_LINE_ERROR = cast(
    type[Exception],
    next(base for base in typer.BadParameter.__mro__ if base.__name__ == "ClickException"),
)


def exit_refused(exc: Exception) -> NoReturn:
    """Click's usage, hint and error line on stderr, then exit with Click's status for it."""
    refused = cast(CommandLineError, exc)
    shown = io.StringIO()
    refused.show(file=shown)
    for line in shown.getvalue().splitlines():
        if line.startswith("Error: "):
            line = "error: " + line.removeprefix("Error: ")
        print(line, file=sys.stderr)
    sys.exit(refused.exit_code)
