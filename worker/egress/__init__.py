"""A run's network, held outside the run: an egress proxy of the worker's whose listening socket
is made inside the call's network namespace (``netns``), which checks every connection against
the run's destinations and what is always refused (``rules``) and counts them (``proxy``).

The run's namespace has loopback alone: no route, no resolver. What it reaches, it reaches
through the proxy at ``127.0.0.1:<port>`` of its own loopback (``HTTP_PROXY`` and the rest in
its environment), which resolves names itself, only those the run may reach, and connects from
the worker's namespace. A raw connection that bypasses the proxy finds no route.
"""

from worker.egress.session import Egress, open_egress
from worker.exceptions import NoNetworkNamespace

__all__ = ["Egress", "NoNetworkNamespace", "open_egress"]
