"""A run's ``network`` against what the operator lets runs ask for (``TOOLQ_NETWORK_ALLOWED``,
and per tenant ``TOOLQ_TENANT_NETWORK_ALLOWED`` where tokens name tenants): each refusal is a
validation error of the request (422), so nothing of a run asking for more is started."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from api.settings import OrchestratorSettings
from worker.contract.network import NetworkChoice

#: Where a run's network is in a request, as a validation error says it.
Location = tuple[str | int, ...]


def network_errors(
    networks: Iterable[tuple[Location, NetworkChoice]],
    settings: OrchestratorSettings,
    tenant: str | None,
    *,
    fleet: bool = True,
) -> list[dict[str, Any]]:
    """Validation errors (as FastAPI's 422 lists them) for each network asking for more than
    the fleet, or ``tenant`` (None: no tenants), allows; ``fleet=False``: the tenant's
    narrowing alone (where the fleet's was checked already)."""
    errors = []
    for where, network in networks:
        refused = settings.network_refusal(network, tenant, fleet=fleet)
        if refused is not None:
            errors.append({"loc": where, "msg": refused, "type": "value_error"})
    return errors
