"""What runs beside a ``with`` block: started on entering it, stopped on leaving it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Self


class Background(ABC):
    """Started by ``with``; stopped on leaving the block, or at once when starting fails, so
    that what had started by then does not outlive the failure."""

    @abstractmethod
    def start(self) -> None: ...

    @abstractmethod
    def stop(self) -> None:
        """Stop what has started; nothing when nothing has (a start that failed early)."""

    def __enter__(self) -> Self:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
