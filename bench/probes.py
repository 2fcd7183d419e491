"""CPU time spent inside chosen functions of a running process, to say where its CPU went.

A probe replaces one attribute (a function or method) by a wrapper that adds up the calling
thread's CPU time inside it. It suits functions that do not wait on I/O, sync or async: for an
async one that awaited real I/O, other tasks' work would be counted too.
"""

from __future__ import annotations

import functools
import inspect
import time
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
