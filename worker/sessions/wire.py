"""What the worker asks a session's holder and what the holder answers: one line of JSON each
way over the holder's unix socket."""

from __future__ import annotations

import socket
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

#: What a call does with the session, as Inspect's ``bash_session()`` names it.
Action = Literal["type_submit", "type", "read", "interrupt", "restart"]
#: What the holder is asked: a call's action (``restart`` aside, which the worker's side does by
#: ending the holder and starting another), or ``end``.
HolderAction = Literal["type_submit", "type", "read", "interrupt", "end"]
#: The longest line either side sends: the input of a call, or an answer with its output.
MAX_LINE_BYTES = 4 << 20


class HolderRequest(BaseModel):
    """One call, as its holder is asked it."""

    model_config = ConfigDict(extra="forbid")

    action: HolderAction
    #: Text typed (``type_submit`` adds Enter).
    input: str = ""
    #: How long the call may wait for the shell's prompt or for output, in milliseconds.
    wait_ms: int = Field(gt=0)


class HolderAnswer(BaseModel):
    """What the terminal printed since the last call read it, and how the shell stands."""

    model_config = ConfigDict(extra="forbid")

    output: str = ""
    #: A command still runs: the shell is not back at its prompt (or a program waits for input).
    running: bool = False
    #: The exit status of the last command, when the shell came back to its prompt.
    exit_code: int | None = None
    #: Bytes of output dropped from the start (the cap keeps the latest, what the screen shows).
    cut_bytes: int = 0
    #: The shell has exited (``exit``, or killed): a ``restart`` starts another.
    ended: bool = False


def send_line(conn: socket.socket, model: BaseModel) -> None:
    conn.sendall(model.model_dump_json().encode() + b"\n")


def read_line(conn: socket.socket) -> bytes:
    """One line from ``conn`` (without its newline); ``ConnectionError`` when it closes first or
    the line is longer than any side sends."""
    chunks: list[bytes] = []
    size = 0
    while True:
        chunk = conn.recv(65536)
        if not chunk:
            raise ConnectionError("the other side closed the connection mid-line")
        end = chunk.find(b"\n")
        if end >= 0:
            chunks.append(chunk[:end])
            return b"".join(chunks)
        chunks.append(chunk)
        size += len(chunk)
        if size > MAX_LINE_BYTES:
            raise ConnectionError("a line longer than any holder sends")
