"""The uids runs take (``TOOLQ_SANDBOX_UID_RANGE``): how a range is written and read."""

from __future__ import annotations

import re
from dataclasses import dataclass

#: The default range: high enough to be nobody's on an ordinary host, and below the 2^31 that
#: some tools still treat as signed.
DEFAULT_UID_RANGE = "2000000000-2000999999"
_RANGE = re.compile(r"\s*(\d+)\s*-\s*(\d+)\s*")


@dataclass(frozen=True, slots=True)
class UidRange:
    """The uids (and, number for number, gids) runs take: ``first`` to ``last`` inclusive."""

    first: int
    last: int

    @classmethod
    def parse(cls, text: str) -> UidRange:
        """``"2000000000-2000999999"``; raises ValueError saying what a range looks like."""
        match = _RANGE.fullmatch(text)
        if match is None:
            raise ValueError(
                f"a uid range is written FIRST-LAST, e.g. {DEFAULT_UID_RANGE}, not {text!r}"
            )
        first, last = int(match[1]), int(match[2])
        if not 1000 <= first <= last < 2**32 - 1:
            raise ValueError(
                f"the uid range {text!r} must lie between 1000 and 4294967294, first <= last"
            )
        return cls(first, last)

    @property
    def size(self) -> int:
        return self.last - self.first + 1

    def __contains__(self, uid: object) -> bool:
        return isinstance(uid, int) and self.first <= uid <= self.last

    def __str__(self) -> str:
        return f"{self.first}-{self.last}"
