"""Which connection a run's proxy makes: the run's destinations, and what no run reaches
whatever its list says (the broker, the host's own addresses, loopback, link-local and the
metadata address, multicast and the unspecified address).

Names are resolved here, by the worker, and only names the run may reach (a listed host name,
or any name for ``full``): a run cannot make the worker ask the resolver about a name of its
choosing. The connection goes to an address this resolution gave, checked, so a name that
resolves to the broker or the host is refused as the address itself is.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from worker.contract.network import IpAddress, NetworkPolicy

#: Networks no run reaches, with the reason a refusal gives.
_NEVER = tuple(
    (ipaddress.ip_network(net), why)
    for net, why in (
        ("169.254.169.254/32", "the metadata address"),
        ("127.0.0.0/8", "loopback of the host"),
        ("::1/128", "loopback of the host"),
        ("169.254.0.0/16", "link-local"),
        ("fe80::/10", "link-local"),
        ("0.0.0.0/8", "the unspecified address"),
        ("::/128", "the unspecified address"),
        ("224.0.0.0/4", "multicast"),
        ("ff00::/8", "multicast"),
        ("255.255.255.255/32", "broadcast"),
        ("fd00:ec2::254/128", "the metadata address"),
    )
)


def plain(address: IpAddress) -> IpAddress:
    """An IPv4 address written as IPv6 (``::ffff:127.0.0.1``) as the IPv4 address it is."""
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def host_addresses() -> frozenset[IpAddress]:
    """Every address of this host's (the worker's namespace's) interfaces."""
    found: set[IpAddress] = set()
    last = ""
    try:
        for line in Path("/proc/self/net/fib_trie").read_text().splitlines():
            stripped = line.strip()
            if stripped.startswith("|--"):
                last = stripped[3:].strip()
            elif stripped.startswith("/32 host LOCAL") and last:
                found.add(ipaddress.ip_address(last))
    except (OSError, ValueError):
        pass
    try:
        for line in Path("/proc/self/net/if_inet6").read_text().splitlines():
            hexed = line.split()[0]
            found.add(ipaddress.ip_address(":".join(hexed[i : i + 4] for i in range(0, 32, 4))))
    except (OSError, ValueError, IndexError):
        pass
    return frozenset(found)


def addresses_of_urls(urls: Iterable[str | None]) -> frozenset[IpAddress]:
    """The addresses the hosts of ``urls`` resolve to here (the broker's, the result store's)."""
    found: set[IpAddress] = set()
    for url in urls:
        host = urlsplit(url).hostname if url else None
        if not host:
            continue
        try:
            infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
        except OSError:
            continue
        for info in infos:
            found.add(plain(ipaddress.ip_address(info[4][0])))
    return frozenset(found)


@dataclass(frozen=True, slots=True)
class Verdict:
    """Where to connect (addresses in order), or why not."""

    addresses: tuple[IpAddress, ...] = ()
    refusal: str | None = None


class Guard:
    """The addresses no run reaches on this worker: the fixed ones, the host's own and the
    broker's. The host's are read for every check (a fraction of a millisecond): an interface
    that came up a moment ago is the host's at once, where a cache kept for seconds would let a
    list that covers its address reach it."""

    def __init__(self, broker_addresses: frozenset[IpAddress]) -> None:
        self.broker = broker_addresses

    def never(self, address: IpAddress) -> str | None:
        """Why no run reaches ``address``; None when a run may."""
        address = plain(address)
        if address in self.broker:
            return "the broker"
        for network, why in _NEVER:
            if address.version == network.version and address in network:
                return why
        if address in host_addresses():
            return "an address of the worker's host"
        return None


def parse_address(host: str) -> IpAddress | None:
    try:
        return plain(ipaddress.ip_address(host.strip("[]")))
    except ValueError:
        return None


def may_name(policy: NetworkPolicy, host: str, port: int) -> bool:
    """The run may reach host name ``host`` on ``port``: so the worker may resolve it."""
    if policy.mode == "full":
        return True
    name = host.lower().rstrip(".")
    return any(d.host == name and d.covers_port(port) for d in policy.destinations)


def may_address(policy: NetworkPolicy, address: IpAddress, port: int) -> bool:
    """The run's list names a network holding ``address`` with ``port`` (or it is ``full``)."""
    if policy.mode == "full":
        return True
    return any(
        d.network is not None
        and d.network.version == address.version
        and address in d.network
        and d.covers_port(port)
        for d in policy.destinations
    )


def resolve(host: str, port: int) -> list[IpAddress]:
    """``host``'s addresses, in the resolver's order (blocking: run it off the event loop)."""
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return list(dict.fromkeys(plain(ipaddress.ip_address(i[4][0])) for i in infos))


def judge(policy: NetworkPolicy, guard: Guard, host: str, port: int) -> Verdict:
    """Where a connection to ``host:port`` goes for a run of ``policy``, or why it does not
    (blocking: it may resolve)."""
    if policy.is_none:
        return Verdict(refusal="this run has no network")
    if not 1 <= port <= 65535:
        return Verdict(refusal=f"port {port} is not a port")
    literal = parse_address(host)
    if literal is not None:
        why = guard.never(literal)
        if why is not None:
            return Verdict(refusal=f"{literal} is {why}, which no run reaches")
        if not may_address(policy, literal, port):
            return Verdict(refusal=f"{literal}:{port} is not in this run's network list")
        return Verdict(addresses=(literal,))
    if not may_name(policy, host, port):
        return Verdict(refusal=f"{host}:{port} is not in this run's network list")
    try:
        found = resolve(host, port)
    except OSError as exc:
        return Verdict(refusal=f"{host} does not resolve ({exc.strerror or exc})")
    allowed = [a for a in found if guard.never(a) is None]
    if not allowed:
        whys = sorted({str(guard.never(a)) for a in found})
        return Verdict(refusal=f"{host} resolves only to {', '.join(whys)}, which no run reaches")
    return Verdict(addresses=tuple(allowed))
