"""Loopback up in a box's network namespace: a box has no network, but ``localhost`` works in
it, as in Docker's ``--network none``. (runsc's own network stack brings it up itself.)"""

from __future__ import annotations

from worker.egress.netns import bring_loopback_up, in_network_of


def loopback_up(pid: int) -> None:
    """Bring ``lo`` up in the network namespace of process ``pid``; ``OSError`` if it cannot."""
    in_network_of(pid, bring_loopback_up)
