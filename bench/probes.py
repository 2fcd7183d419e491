"""Time spent inside chosen functions of a running process, to say where its CPU (or its wall
clock) went.

A probe replaces one attribute (a function or method) by a wrapper that adds up the calling
thread's CPU time inside it. It suits functions that do not wait on I/O, sync or async: for an
async one that awaited real I/O, other tasks' work would be counted too. ``WallProbe`` keeps the
wall-clock spans instead, for steps that wait.
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from collections.abc import Callable
from typing import Any


class CpuProbe:
    def __init__(self, owner: Any, attribute: str, label: str) -> None:
        self.owner = owner
        self.attribute = attribute
        self.label = label
        self.seconds = 0.0
        self.calls = 0

    def install(self) -> bool:
        """Wrap the attribute; False when it is not there (the probed code changed)."""
        original = getattr(self.owner, self.attribute, None)
        if original is None:
            return False
        if inspect.iscoroutinefunction(original):

            @functools.wraps(original)
            async def timed_async(*args: Any, **kwargs: Any) -> Any:
                started = time.thread_time()
                try:
                    return await original(*args, **kwargs)
                finally:
                    self._add(started)

            setattr(self.owner, self.attribute, timed_async)
        else:

            @functools.wraps(original)
            def timed(*args: Any, **kwargs: Any) -> Any:
                started = time.thread_time()
                try:
                    return original(*args, **kwargs)
                finally:
                    self._add(started)

            setattr(self.owner, self.attribute, timed)
        return True

    def _add(self, started: float) -> None:
        self.seconds += time.thread_time() - started
        self.calls += 1


class WallProbe:
    """Wall-clock spans spent inside one attribute (a sync function or method), each with the
    thread it ran in and, with ``tag``, what the call's arguments say of it: for steps that wait
    on a process or a socket, which CPU time misses."""

    def __init__(self, owner: Any, attribute: str, tag: Callable[..., str] | None = None) -> None:
        self.owner = owner
        self.attribute = attribute
        self.spans: list[tuple[str, float, float, str]] = []
        self._tag = tag
        self._original: Any = None

    def install(self) -> bool:
        """Wrap the attribute; False when it is not there (the probed code changed)."""
        original = getattr(self.owner, self.attribute, None)
        if original is None or inspect.iscoroutinefunction(original):
            return False
        self._original = original

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            tag = "" if self._tag is None else self._tag(*args, **kwargs)
            started = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                thread = threading.current_thread().name
                self.spans.append((thread, started, time.perf_counter(), tag))

        setattr(self.owner, self.attribute, timed)
        return True

    def uninstall(self) -> None:
        if self._original is not None:
            setattr(self.owner, self.attribute, self._original)
            self._original = None

    def durations_ms(self, thread: str | None = None) -> list[float]:
        """Each span's length, those of ``thread`` only when it is named."""
        return [
            (ended - started) * 1000
            for name, started, ended, _ in self.spans
            if thread is None or name == thread
        ]
