"""One call's network: the proxy's listener made in the call's namespace, served for as long as
the call runs, and the variables that point the command's programs at it."""

from __future__ import annotations

import functools
from dataclasses import dataclass

from worker.contract.network import NetworkPolicy
from worker.contract.settings import get_worker_settings
from worker.egress.netns import listener_in, separate_namespace
from worker.egress.proxy import Counts, Served, serve, stop
from worker.egress.rules import Guard, addresses_of_urls
from worker.exceptions import NoNetworkNamespace

#: What ``NO_PROXY`` names: the command's own loopback, which it reaches without the proxy.
_NO_PROXY = "localhost,127.0.0.1,::1"


@functools.lru_cache(maxsize=1)
def worker_guard() -> Guard:
    """The guard of this worker process: the broker's and the result store's addresses as they
    resolve when its first call with a network comes."""
    settings = get_worker_settings()
    return Guard(addresses_of_urls((settings.effective_broker_url, settings.redis_url)))


@dataclass
class Egress:
    """A call's proxy, serving until ``close``."""

    served: Served
    port: int
    _counts: Counts | None = None

    @property
    def env(self) -> dict[str, str]:
        """The variables that send the command's HTTP clients through the proxy."""
        url = f"http://127.0.0.1:{self.port}"
        names = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")
        return {
            **dict.fromkeys(names, url),
            "NO_PROXY": _NO_PROXY,
            "no_proxy": _NO_PROXY,
            "TOOLQ_NETWORK_PROXY": url,
        }

    def close(self) -> Counts:
        """Stop serving (once); what was allowed and refused."""
        if self._counts is None:
            self._counts = stop(self.served)
        return self._counts


def open_egress(policy: NetworkPolicy, pid: int) -> Egress:
    """A proxy for a run of ``policy`` listening in the network namespace of process ``pid``
    (the call's, or its box's); ``NoNetworkNamespace`` where that is the worker's own."""
    if not separate_namespace(pid):
        raise NoNetworkNamespace(
            "this worker gives commands no network namespace of their own "
            "(TOOLQ_SANDBOX_ISOLATION=process, or namespaces do not work here), so it cannot "
            f'hold a run to network {policy.describe()!r}; ask for network "none"'
        )
    listener = listener_in(pid)
    port = listener.getsockname()[1]
    try:
        served = serve(listener, policy, worker_guard())
    except BaseException:
        listener.close()
        raise
    return Egress(served, port)
