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
from worker.contract.network import MAX_DESTINATIONS

#: (component, property, which names): the tool lists of the request bodies.
TOOL_LISTS = (
    ("AgentOptions", "enable", "served"),
    ("AgentOptions", "disable", "known"),
    ("BatchItem", "enable", "served"),
)
#: What each kind of list takes, as its description says.
_TAKES = {"served": "a tool a live worker serves", "known": "a tool some worker has published"}


#: (component, property): a run's network, as TOOLQ_NETWORK_ALLOWED permits it.
NETWORKS = (("AgentOptions", "network"), ("BatchItem", "network"))
#: A destination the document offers where any list is allowed: a host name (its last label
#: starts with a letter, so it is never read as an address) and a port, or * for any port.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,28}[a-z0-9])?"
_LAST_LABEL = r"[a-z](?:[a-z0-9-]{0,28}[a-z0-9])?"
_PORT = (
    r"(?:[1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5]|\*)"
)
DESTINATION_PATTERN = rf"^(?:{_LABEL}\.){{0,3}}{_LAST_LABEL}:{_PORT}$"

#: The component of a run's own ``limits`` (HTTP runs and batch items alike), whose fields
#: stop at the operator's TOOLQ_LIMITS_MAX_* (and the time at TOOLQ_MAX_TIMEOUT_MS).
RUN_LIMITS = "RunLimits"

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
        # A run's limits up to what the operator lets a run ask, as the server checks them.
        run_most = {
            "timeout_s": round(limits.max_call_s * 1000) / 1000,
            "memory_mb": limits.limits_max.memory_mb,
            "pids": limits.limits_max.pids,
            "cpu": limits.limits_max.cpu,
        }
        capped = [(component, prop, limits.max_command_s) for component, prop in COMMAND_TIMEOUTS]
        capped += [(RUN_LIMITS, name, maximum) for name, maximum in run_most.items()]
        for component, prop, maximum in capped:
            field = components.get(component, {}).get("properties", {}).get(prop)
            for choice in field.get("anyOf", [field]) if field is not None else []:
                if choice.get("type") in ("integer", "number"):
                    choice["maximum"] = maximum
        for component, prop in NETWORKS:
            field = components.get(component, {}).get("properties", {}).get(prop)
            if field is not None:
                components[component]["properties"][prop] = _network_schema(field, limits)
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
            f"{field.get('description', '').rstrip('.')}: {_TAKES[which]} (the names as this "
            "server found them when it gave this document)."
        )
    return document


def _network_schema(field: dict[str, Any], limits: ItemLimits) -> dict[str, Any]:
    """A run's ``network`` as TOOLQ_NETWORK_ALLOWED lets runs ask for it: "none" always,
    "full" where it is full, and a list of destinations where lists are allowed (the allowed
    destinations themselves where it names them)."""
    allowance = limits.network
    modes = ["none", "full"] if allowance.mode == "full" else ["none"]
    choices: list[dict[str, Any]] = [{"type": "string", "enum": modes}]
    if allowance.mode != "none":
        item: dict[str, Any] = {"type": "string", "pattern": DESTINATION_PATTERN}
        if allowance.destinations:
            item = {"type": "string", "enum": [str(d) for d in allowance.destinations]}
        choices.append({"type": "array", "items": item, "maxItems": MAX_DESTINATIONS})
    described = {k: v for k, v in field.items() if k not in ("anyOf", "type", "items")}
    return {**described, "anyOf": choices}
