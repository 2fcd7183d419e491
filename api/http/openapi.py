"""The OpenAPI document as this server serves it: with the tool names its fleet accepts now.

Which tools a run may switch on depends on the fleet, not on the code: a tool is accepted in
``enable`` while a live worker serves its pool, and in ``disable`` while any worker has published
it. The document lists those names, read when it is asked for, so that a request the schema
allows is one the server takes.
"""

from __future__ import annotations

import copy
from typing import Any

from api.fleet import Fleet

#: (component, property, which names): the tool lists of the request bodies.
TOOL_LISTS = (
    ("AgentOptions", "enable", "served"),
    ("AgentOptions", "disable", "known"),
    ("BatchItem", "enable", "served"),
)


def with_fleet_tools(schema: dict[str, Any], fleet: Fleet) -> dict[str, Any]:
    """A copy of ``schema`` whose tool lists name the tools ``fleet`` accepts."""
    names = {
        "served": [name for name in fleet.tools if fleet.serves(name)],
        "known": list(fleet.tools),
    }
    document = copy.deepcopy(schema)
    components = document.get("components", {}).get("schemas", {})
    for component, prop, which in TOOL_LISTS:
        field = components.get(component, {}).get("properties", {}).get(prop)
        if field is None:
            continue
        accepted = names[which]
        if accepted:
            field["items"] = {**field.get("items", {}), "enum": accepted}
        else:
            field["maxItems"] = 0  # an empty enum is not valid JSON Schema: no item at all
        field["description"] = (
            f"{field.get('description', '').rstrip('.')}: "
            + (
                "a tool a live worker serves"
                if which == "served"
                else "a tool some worker has published"
            )
            + " (the names as this server found them when it gave this document)."
        )
    return document
