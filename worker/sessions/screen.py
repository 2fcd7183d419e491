"""What a session's terminal printed: appended by the holder's reader, waited on and taken by
calls. The shell's word that it waits at its prompt (``shell.prompt_marker``) is taken out of
the text and remembered, with the exit status it carries."""

from __future__ import annotations

import re
import threading
import time

#: Start of an operating-system command sequence, which a terminal shows nothing of.
_OSC = b"\x1b]"


class Screen:
    """The terminal's output since a call last took it, at most ``cap_bytes`` of it (the latest:
    what the screen shows), and whether the shell waits at its prompt."""

    def __init__(self, nonce: str, cap_bytes: int) -> None:
        self._marker = re.compile(rb"\x1b\]9;toolq-" + nonce.encode() + rb":(\d+)\x07")
        self._cap = cap_bytes
        self._text = bytearray()
        #: Bytes read that may be the start of a marker, kept until the rest comes.
        self._pending = b""
        self._cut = 0
        self._at_prompt = False
        self._exit_code: int | None = None
        self._last_output = 0.0
        self._closed = False
        self._changed = threading.Condition()

    def append(self, data: bytes) -> None:
        with self._changed:
            data = self._pending + data
            self._pending = b""
            start = 0
            for found in self._marker.finditer(data):
                self._add(data[start : found.start()])
                self._at_prompt = True
                self._exit_code = int(found.group(1))
                start = found.end()
            rest = data[start:]
            partial = rest.rfind(_OSC)
            if partial >= 0 and b"\x07" not in rest[partial:] and len(rest) - partial < 64:
                self._pending = rest[partial:]
                rest = rest[:partial]
            self._add(rest)
            self._changed.notify_all()

    def close(self) -> None:
        """The terminal is gone: nothing more will come."""
        with self._changed:
            self._closed = True
            self._changed.notify_all()

    @property
    def closed(self) -> bool:
        return self._closed

    def _add(self, data: bytes) -> None:
        if not data:
            return
        # Output alone says nothing of the shell's state: a background job may print anytime.
        self._last_output = time.monotonic()
        self._text += data
        over = len(self._text) - self._cap
        if over > 0:
            del self._text[:over]
            self._cut += over

    def typed(self) -> None:
        """Input went to the shell: it is no longer known to wait at its prompt."""
        with self._changed:
            self._at_prompt = False
            self._exit_code = None
            self._last_output = time.monotonic()

    def wait(self, deadline: float, quiet_s: float | None) -> None:
        """Until the shell is back at its prompt, the terminal closes, ``deadline`` passes, or
        (with ``quiet_s``) output came and then nothing more for ``quiet_s`` seconds: a program
        that waits for input says so only by printing its own prompt (no end of line) and
        waiting."""
        with self._changed:
            while not (self._at_prompt or self._closed):
                now = time.monotonic()
                if now >= deadline:
                    return
                until = deadline
                # A program waiting for input shows a prompt of its own (">>> ", "[y/N] "),
                # not a whole line: lines are output that more may follow.
                if quiet_s is not None and self._text and not self._text.endswith(b"\n"):
                    settled = self._last_output + quiet_s
                    if now >= settled:
                        return
                    until = min(until, settled)
                self._changed.wait(until - now)

    def take(self) -> tuple[bytes, int, bool, int | None]:
        """The output since the last take, the bytes cut from its start, whether the shell waits
        at its prompt, and its last command's exit status if it does."""
        with self._changed:
            text, cut = bytes(self._text), self._cut
            self._text.clear()
            self._cut = 0
            return text, cut, self._at_prompt, self._exit_code if self._at_prompt else None
