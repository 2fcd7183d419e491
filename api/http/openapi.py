"""The OpenAPI document as this server serves it: with the tool names its fleet accepts now.

Which tools a run may switch on depends on the fleet, not on the code: a tool is accepted in
``enable`` while a live worker serves its pool, and in ``disable`` while any worker has published
it. The document lists those names, read when it is asked for, so that a request the schema
allows is one the server takes.
"""

from __future__ import annotations

import copy
from typing import Any

from api.batch.items import ItemLimits
from api.calls.fleet import Fleet

#: (component, property, which names): the tool lists of the request bodies.
TOOL_LISTS = (
    ("AgentOptions", "enable", "served"),
    ("AgentOptions", "disable", "known"),
    ("BatchItem", "enable", "served"),
)


#: (component, property): a batch item's command timeouts, bounded by the fleet's deadlines.
COMMAND_TIMEOUTS = (("BatchItem", "setup_timeout_s"), ("BatchItem", "check_timeout_s"))


def with_fleet_tools(
    schema: dict[str, Any], fleet: Fleet, limits: ItemLimits | None = None
) -> dict[str, Any]:
    """A copy of ``schema`` whose tool lists name the tools ``fleet`` offers models, and whose
    command timeouts stop at what ``limits`` allow."""
    offered = fleet.model_tools
    names = {
        "served": [name for name in offered if fleet.serves(name)],
        "known": list(offered),
    }
    document = copy.deepcopy(schema)
    components = document.get("components", {}).get("schemas", {})
    if limits is not None:
        for component, prop in COMMAND_TIMEOUTS:
            field = components.get(component, {}).get("properties", {}).get(prop)
            for choice in field.get("anyOf", [field]) if field is not None else []:
                if choice.get("type") == "number":
                    choice["maximum"] = limits.max_command_s
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
