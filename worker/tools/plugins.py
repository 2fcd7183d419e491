"""Users' own tools: modules named in settings or in the ``toolq.tools`` entry-point group."""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from functools import lru_cache
from importlib.metadata import entry_points
from types import ModuleType
from typing import Protocol, cast

from worker.exceptions import PluginError
from worker.tools.context import ToolContext
from worker.tools.registry import ToolRegistry
from worker.tools.workspace import Workspace

ENTRY_POINT_GROUP = "toolq.tools"


class _Register(Protocol):
    def __call__(
        self, registry: ToolRegistry, context: ToolContext, workspace: Workspace
    ) -> None: ...


@lru_cache(maxsize=8)
def load_plugins(module_names: tuple[str, ...]) -> tuple[_Register, ...]:
    """Import each plugin module once per process and return its ``register`` hook."""
    names = list(module_names) + [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]
    hooks: list[_Register] = []
    for name in dict.fromkeys(names):
        try:
            module: ModuleType = importlib.import_module(name)
        except ImportError as exc:
            raise PluginError(f"Cannot import tool plugin {name!r}: {exc}") from exc
        hook = getattr(module, "register", None)
        if not callable(hook):
            raise PluginError(
                f"Tool plugin {name!r} has no register(registry, context, workspace) function"
            )
        hooks.append(cast(_Register, hook))
    return tuple(hooks)


def register_plugins(
    hooks: Iterable[_Register], registry: ToolRegistry, context: ToolContext, workspace: Workspace
) -> None:
    for hook in hooks:
        hook(registry, context, workspace)
