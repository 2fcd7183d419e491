"""What the viewer's list and table pages share of their address's query: reading it, each
parameter checked and what cannot be read said why, and writing it back as a link."""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import urlencode

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

QueryT = TypeVar("QueryT", bound="DataclassInstance")


@dataclass
class QueryReader:
    """A page's query parameters as they are read: each one that can be read goes to ``values``
    under its name; one that cannot is left out, and ``problems`` says why."""

    params: Mapping[str, str]
    values: dict[str, Any] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)

    def given(self, name: str) -> str:
        """The parameter as given, stripped; empty when it is not."""
        return self.params.get(name, "").strip()

    def check(
        self, name: str, valid: Callable[[str], object], problem: Callable[[str], str]
    ) -> None:
        """The parameter where ``valid`` holds of it; where not, ``problem`` (given it) says why."""
        value = self.given(name)
        if value and not valid(value):
            self.problems.append(problem(value))
        elif value:
            self.values[name] = value

    def choice(self, name: str, allowed: Sequence[str], label: str) -> None:
        """The parameter where it is one of ``allowed``."""
        self.check(
            name,
            lambda value: value in allowed,
            lambda value: f"{label} {value!r} is not one of {', '.join(allowed)}",
        )

    def per_page(self, choices: Sequence[int]) -> None:
        """Rows per page (``per_page``), one of ``choices``."""
        self.choice("per_page", [str(n) for n in choices], "rows per page")
        if "per_page" in self.values:
            self.values["per_page"] = int(self.values["per_page"])

    def number(self, name: str, label: str, kind: type[int] | type[float]) -> None:
        """The parameter as a number of ``kind``, zero or more."""
        raw = self.given(name)
        if not raw:
            return
        try:
            value = kind(raw)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            self.problems.append(f"{label} {raw!r} is not {what}")
            return
        if value < 0 or not math.isfinite(value):
            self.problems.append(f"{label} {raw!r} must be zero or more")
            return
        self.values[name] = value


def query_link(query: QueryT, **changes: Any) -> str:
    """``?...`` for ``query`` with ``changes``: its fields that differ from their defaults."""
    changed = replace(query, **changes)
    pairs = {
        f.name: getattr(changed, f.name)
        for f in fields(changed)
        if getattr(changed, f.name) != f.default
    }
    return "?" + urlencode(pairs) if pairs else ""
