"""The port a server command (``serve``, ``view``, ``scripted-llm``) listens on: taken before the
server starts, so that a port toolq cannot have is one line and the same exit status in each,
never a web server's own log lines.

A port in use is a choice on the command line the user makes again (``--port``), as with any
other value this host cannot take: exit status 2, with bad input. Status 3 is for what must be
installed or set up first, and 1 for the fleet that cannot be reached; neither would tell the
user to pick another port.
"""

from __future__ import annotations

import errno
import socket
import sys
from typing import NoReturn

import typer

#: The exit status of a port that cannot be listened on: bad input, as the user picks it.
EXIT_CANNOT_LISTEN = 2
#: The ports there are; 0 asks the system for a free one.
LOWEST_PORT, HIGHEST_PORT = 0, 65535
#: uvicorn's default backlog.
BACKLOG = 2048


def port_option(help_text: str) -> typer.models.OptionInfo:
    """A ``--port`` option: a number outside 0-65535 is refused on the command line."""
    option: typer.models.OptionInfo = typer.Option(
        min=LOWEST_PORT, max=HIGHEST_PORT, help=help_text
    )
    return option


def listen(host: str, port: int, *, backlog: int = BACKLOG) -> socket.socket:
    """A socket listening on ``host``:``port``, bound as uvicorn would bind it; or one line on
    stderr naming the address and what to do, and exit status 2."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        listener.bind((host, port))
        listener.listen(backlog)
    except OSError as exc:
        listener.close()
        _cannot_listen(host, port, exc)
    return listener


def _cannot_listen(host: str, port: int, exc: OSError) -> NoReturn:
    reason = (exc.strerror or str(exc)).lower()
    if exc.errno == errno.EADDRINUSE:
        advice = "choose another --port, or stop what listens there"
    elif exc.errno == errno.EACCES:
        advice = "choose a --port above 1023, or run as a user allowed to take it"
    else:
        advice = "check --host: an address of this machine, such as 127.0.0.1"
    print(f"error: cannot listen on {host}:{port}: {reason}; {advice}", file=sys.stderr)
    raise SystemExit(EXIT_CANNOT_LISTEN)
