"""A run's network: what it asks for (``network``: ``"none"``, ``"full"`` or a list of
destinations) and what the operator lets runs ask for (``TOOLQ_NETWORK_ALLOWED``).

Both sides read the same words here: the orchestrator refuses a run that asks for more than it
may before anything runs, and the worker's egress proxy (``worker.egress``) checks every
connection against the same destinations. A destination is a host name or a CIDR, with a port
(or ``*``, any port): ``pypi.org:443``, ``10.1.2.0/24:8080``, ``[2001:db8::/32]:443``.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Annotated, Literal

from pydantic import AfterValidator, BaseModel, Field

from worker.contract.errors import NetworkRefused

NetworkMode = Literal["none", "list", "full"]
#: What a run's ``network`` is on the wire: a mode's name or the list of destinations.
NetworkChoice = str | list[str]
#: The setting that says what runs may ask for, and its per-tenant companion.
NETWORK_ALLOWED_VARIABLE = "TOOLQ_NETWORK_ALLOWED"
TENANT_NETWORK_VARIABLE = "TOOLQ_TENANT_NETWORK_ALLOWED"
#: The most destinations one run may name.
MAX_DESTINATIONS = 64
#: Any port, written ``*``.
ANY_PORT = 0
_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)(?!-)[a-z0-9-]{1,63}(?<!-)(\.(?!-)[a-z0-9-]{1,63}(?<!-))*\.?$"
)

IpNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
IpAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Destination:
    """One allowed destination: a host name or a network, and a port (``ANY_PORT``: any)."""

    host: str | None
    network: IpNetwork | None
    port: int

    @classmethod
    def parse(cls, text: str) -> Destination:
        written = text.strip()
        where, port = _split_port(written)
        if where.startswith("[") and where.endswith("]"):
            where = where[1:-1]
        try:
            network = ipaddress.ip_network(where, strict=False)
        except ValueError:
            name = where.lower().rstrip(".")
            if not _HOST_NAME.match(name) or name.replace(".", "").isdigit():
                raise NetworkRefused(
                    f"network destination {written!r} is neither a host name nor a CIDR "
                    "(write host:port or CIDR:port, e.g. pypi.org:443 or 10.1.2.0/24:8080)"
                ) from None
            return cls(name, None, port)
        return cls(None, network, port)

    def covers_port(self, port: int) -> bool:
        return self.port in (ANY_PORT, port)

    def covers(self, other: Destination) -> bool:
        """Whatever ``other`` allows, this allows too (an operator's allowance over a run's)."""
        if self.port != ANY_PORT and self.port != other.port:
            return False
        if self.host is not None:
            return other.host == self.host
        if other.network is None or self.network is None:
            return False
        return other.network.version == self.network.version and other.network.subnet_of(
            self.network  # type: ignore[arg-type]
        )

    def __str__(self) -> str:
        where = self.host
        if self.network is not None:  # one address as itself: 10.1.2.3, not 10.1.2.3/32
            one = self.network.prefixlen == self.network.max_prefixlen
            where = str(self.network.network_address) if one else str(self.network)
        if self.network is not None and self.network.version == 6:
            where = f"[{where}]"
        return f"{where}:{'*' if self.port == ANY_PORT else self.port}"


def _split_port(text: str) -> tuple[str, int]:
    where, colon, port_text = text.rpartition(":")
    if not colon or not where:
        raise NetworkRefused(
            f"network destination {text!r} has no port (write host:port or CIDR:port, "
            "e.g. pypi.org:443; * for any port)"
        )
    if port_text == "*":
        return where, ANY_PORT
    if not port_text.isdigit() or not 1 <= int(port_text) <= 65535:
        raise NetworkRefused(
            f"network destination {text!r}: the port must be a number from 1 to 65535, or *"
        )
    return where, int(port_text)


@dataclass(frozen=True, slots=True)
class NetworkPolicy:
    """A run's network: none (loopback alone), the listed destinations, or full (anything but
    what is always refused: the broker, the host, link-local and metadata addresses)."""

    mode: NetworkMode
    destinations: tuple[Destination, ...] = ()

    @classmethod
    def parse(cls, value: object) -> NetworkPolicy:
        """``value`` as a run writes it; ``NetworkRefused`` in one line if it is not one."""
        if value is None or value == "none":
            return NONE
        if value == "full":
            return FULL
        if isinstance(value, str):
            if value.strip().startswith("["):
                raise NetworkRefused(
                    'network must be "none", "full" or a list of destinations, not a string '
                    "that looks like a list"
                )
            value = [part for part in value.split(",") if part.strip()]
        if not isinstance(value, Sequence) or not all(isinstance(v, str) for v in value):
            raise NetworkRefused(
                'network must be "none", "full" or a list of host:port / CIDR:port strings'
            )
        if not value:
            return NONE
        if len(value) > MAX_DESTINATIONS:
            raise NetworkRefused(
                f"network names {len(value)} destinations; at most {MAX_DESTINATIONS}"
            )
        return cls("list", tuple(dict.fromkeys(Destination.parse(v) for v in value)))

    @property
    def is_none(self) -> bool:
        return self.mode == "none"

    def wire(self) -> NetworkChoice:
        """As a run writes it (and the wire carries it)."""
        if self.mode == "list":
            return [str(d) for d in self.destinations]
        return self.mode

    def describe(self) -> str:
        return ", ".join(str(d) for d in self.destinations) if self.mode == "list" else self.mode


NONE = NetworkPolicy("none")
FULL = NetworkPolicy("full")


@dataclass(frozen=True, slots=True)
class NetworkAllowance:
    """What the operator lets runs ask for: ``none`` (only no network), ``list`` (any list),
    ``full`` (anything), or the destinations a run's list must stay within."""

    mode: NetworkMode
    destinations: tuple[Destination, ...] = ()

    @classmethod
    def parse(cls, value: str | Iterable[str] | None, setting: str) -> NetworkAllowance:
        """``value`` of the setting named ``setting``; ``NetworkRefused`` naming it if bad
        (empty ``setting``: where the message is named already, as the settings check does)."""
        parts = value.split(",") if isinstance(value, str) else list(value or [])
        words = [p.strip() for p in parts if p.strip()]
        if not words or words == ["none"]:
            return cls("none")
        if words in (["list"], ["full"]):
            return cls("list" if words == ["list"] else "full")
        try:
            return cls("list", tuple(Destination.parse(w) for w in words))
        except NetworkRefused as exc:
            said = f"{exc} (or none, list, full)"
            raise NetworkRefused(f"{setting}: {said}" if setting else said) from None

    def refusal(self, policy: NetworkPolicy, setting: str) -> str | None:
        """Why ``policy`` asks for more than this allows (one line naming ``setting``); None
        when it may run."""
        if policy.is_none or self.mode == "full":
            return None
        if policy.mode == "full":
            return f'network "full" is not allowed here ({setting}={self.describe()})'
        if self.mode == "none":
            return f'a network is not allowed here ({setting}=none): ask for "none"'
        for wanted in policy.destinations:
            if self.destinations and not any(a.covers(wanted) for a in self.destinations):
                return (
                    f"network destination {wanted} is not allowed here ({setting} allows "
                    f"{self.describe()})"
                )
        return None

    def describe(self) -> str:
        if self.mode == "list" and self.destinations:
            return ",".join(str(d) for d in self.destinations)
        return self.mode


#: What runs may ask for where nothing else is said: no network.
ONLY_NONE = NetworkAllowance("none")


def tenant_allowances(
    text: str | None, setting: str = TENANT_NETWORK_VARIABLE
) -> dict[str, NetworkAllowance]:
    """``TOOLQ_TENANT_NETWORK_ALLOWED`` read: ``acme=pypi.org:443,x.org:443;ci=full``, each
    tenant's allowance by name; ``NetworkRefused`` naming ``setting`` (where not empty) for a
    bad part."""
    prefix = f"{setting}: " if setting else ""
    found: dict[str, NetworkAllowance] = {}
    for part in (text or "").split(";"):
        if not part.strip():
            continue
        name, equals, value = part.partition("=")
        if not equals or not name.strip():
            raise NetworkRefused(
                f"{prefix}{part.strip()!r} is not <tenant>=<allowed> "
                "(e.g. acme=pypi.org:443,files.pythonhosted.org:443;ci=full)"
            )
        found[name.strip()] = NetworkAllowance.parse(value, f"{prefix}{name.strip()}")
    return found


def network_refusal(
    choice: object, fleet: NetworkAllowance, tenant: tuple[str, NetworkAllowance] | None = None
) -> str | None:
    """Why a run asking for network ``choice`` may not run, in one line: not a network, more
    than the fleet allows, or more than its tenant's allowance (name, allowance); None: it may."""
    try:
        policy = NetworkPolicy.parse(choice)
    except NetworkRefused as exc:
        return str(exc)
    refused = fleet.refusal(policy, NETWORK_ALLOWED_VARIABLE)
    if refused is None and tenant is not None:
        refused = tenant[1].refusal(policy, f"{TENANT_NETWORK_VARIABLE} for {tenant[0]}")
    return refused


def _normalized(choice: NetworkChoice) -> NetworkChoice:
    return NetworkPolicy.parse(choice).wire()


#: A run's network as a field takes it: any way ``NetworkPolicy.parse`` reads, kept as written
#: in its one form (``NetworkPolicy.wire``).
NetworkValue = Annotated[NetworkChoice, AfterValidator(_normalized)]


class NetworkFields(BaseModel):
    """What a run says of its network, wherever a run is described (a batch task line, a
    conversation's options and so the HTTP API's runs)."""

    network: NetworkValue = Field(
        "none",
        description='The run\'s network: "none" (loopback alone, the default), "full", or a '
        'list of destinations its commands may reach, host:port or CIDR:port ("*": any port), '
        'e.g. ["pypi.org:443", "10.1.2.0/24:8080"]; as TOOLQ_NETWORK_ALLOWED permits.',
    )
