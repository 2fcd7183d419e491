"""The session's shell: bash, interactive, on the session's terminal as its controlling
terminal (Ctrl-C reaches the command in the foreground), without line editing (what the model
types is not echoed back) and with an empty prompt, telling the holder each time it waits at
its prompt, with the last command's exit status, by a terminal sequence that shows nothing;
and the terminal and the loopback the holder sets up for it."""

from __future__ import annotations

import fcntl
import logging
import os
import select
import shlex
import struct
import termios
import time

from worker.egress.netns import bring_loopback_up, in_network_of, separate_namespace

#: The shell's variables: no prompt text, and the word that it waits at its prompt.
PROMPT_WORD = "printf '\\033]9;toolq-%s:%%d\\007' \"$?\""
#: The prompt of an image's sh, which has no ``PROMPT_COMMAND`` (``PS1``): the same word,
#: in which it expands ``$?``.
SH_PROMPT = "\033]9;toolq-%s:$?\007"
#: The terminal's size: wide, so that lines are seldom wrapped.
ROWS, COLUMNS = 50, 200
#: What one write to the terminal hands over at most.
TYPE_CHUNK = 512

log = logging.getLogger("toolq.session")


def shell_command(terminal: str) -> str:
    """The command line that becomes the session's shell, its standard streams ``terminal``
    (the path of the terminal's other end) and its controlling terminal that one.

    The terminal is opened by the first process of a session of its own (``setsid``), which
    makes it that session's controlling terminal: opened by the command's first shell, which
    without a PID namespace leads the call's session, it would be that session's, and no
    other could take it."""
    inner = 'exec bash --noprofile --norc --noediting -i 0<>"$0" 1>&0 2>&0'
    return f"exec setsid --wait sh -c {shlex.quote(inner)} {shlex.quote(terminal)}"


def shell_env(nonce: str) -> dict[str, str]:
    """The shell's own variables, over the run's minimal environment."""
    return {
        "PS1": "",
        "PS2": "",
        "TERM": "dumb",
        "PROMPT_COMMAND": PROMPT_WORD % nonce,
    }


def box_shell_env(nonce: str) -> dict[str, str]:
    """The shell's own variables in a run's container, over the image's: an image's sh, which
    has no ``PROMPT_COMMAND``, says the prompt word in its ``PS1`` (``box_shells``)."""
    return {**shell_env(nonce), "PS1": SH_PROMPT % nonce}


def loopback_up(master: int) -> None:
    """The shell's network namespace (the run's own, where the sandbox gives one) with its
    loopback up, as a container's: a server started in one call answers ``localhost`` in the
    next. Nothing else of the network: the namespace has no other interface."""
    try:
        shell = os.tcgetpgrp(master)
        if not separate_namespace(shell):
            return  # the host's network: its loopback is up already
    except OSError:
        return
    try:
        in_network_of(shell, bring_loopback_up)
    except OSError as exc:
        log.warning("the session's loopback could not be brought up: %s", exc)


def set_modes(terminal: int) -> None:
    """The terminal's size, and what is typed not shown back."""
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", ROWS, COLUMNS, 0, 0))
    modes = termios.tcgetattr(terminal)
    modes[3] &= ~termios.ECHO
    termios.tcsetattr(terminal, termios.TCSANOW, modes)


def type_into(terminal: int, data: bytes, deadline: float) -> int:
    """Type ``data`` on the terminal (its holder's end); the bytes left untyped.

    What the terminal takes at once is always typed, however late: a call whose wait the
    shell's start used up still runs its command. Only a terminal that takes no more (a
    program that does not read its input) is waited for, until ``deadline``."""
    while data:
        left = max(0.0, deadline - time.monotonic())
        _, writable, _ = select.select([], [terminal], [], left)
        if not writable:
            break
        written = os.write(terminal, data[:TYPE_CHUNK])
        data = data[written:]
    return len(data)
