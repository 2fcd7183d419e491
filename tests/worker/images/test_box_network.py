"""A run with an image gets its network as a run on the worker's files does: the worker's proxy
listens in the box's own network namespace for each call, lets through the run's list and counts;
a raw connection finds no route; gVisor's own network stack is refused a network, in one line."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.worker.images.builders import Images
from tests.worker.images.conftest import Host
from tests.worker.images.test_boxes import run
from tests.worker.netns_server import Served, free_port, served_in_namespace
from worker.contract.network import NetworkPolicy
from worker.sandbox import SandboxError

pytestmark = pytest.mark.netns
#: An HTTP request through the proxy the call's variables name, by hand (the image has nc).
THROUGH_PROXY = (
    "printf 'GET http://{address}:{port}/ HTTP/1.0\\r\\n\\r\\n' "
    '| nc -w 5 127.0.0.1 "${{TOOLQ_NETWORK_PROXY##*:}}"; echo'
)


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[list[Served], Served]]:
    with served_in_namespace((free_port(), free_port())) as found:
        yield found


def test_a_box_reaches_its_list_through_the_proxy_and_nothing_else(
    host: Host, images: Images, servers: tuple[list[Served], Served]
) -> None:
    (listed, unlisted), machine = servers
    workspace, box = host.start("run-box-net", images.alpha)
    command = "; ".join(
        [
            THROUGH_PROXY.format(address=listed.address, port=listed.port),
            THROUGH_PROXY.format(address=unlisted.address, port=unlisted.port),
            THROUGH_PROXY.format(address=machine.address, port=machine.port),
            f"nc -w 2 {listed.address} {listed.port} </dev/null && echo raw-reached "
            "|| echo raw-blocked",
        ]
    )
    network = NetworkPolicy.parse([f"{listed.address}:{listed.port}"])
    result = run(host, workspace, box, command, timeout_ms=60_000, network=network)
    out = result.stdout
    assert listed.body in out, (out, result.stderr)
    assert unlisted.body not in out and machine.body not in out
    assert "not in this run's network list" in out
    assert "an address of the worker's host" in out, (out, result.stderr)
    assert "raw-blocked" in out and "raw-reached" not in out
    assert (result.usage.network_allowed, result.usage.network_refused) == (1, 2)
    # The next call without a network finds no proxy: the listener went with the call.
    after = run(host, workspace, box, "echo ${TOOLQ_NETWORK_PROXY:-none}")
    assert after.stdout == "none\n" and after.usage.network_allowed is None


@pytest.mark.parametrize("host", ["runsc"], indirect=True)
def test_gvisor_is_refused_a_network_in_one_line(host: Host, images: Images) -> None:
    workspace, box = host.start("run-box-gvisor", images.alpha)
    with pytest.raises(SandboxError, match="network stack of its own") as caught:
        run(host, workspace, box, "echo ran", network=NetworkPolicy.parse("full"))
    said = str(caught.value)
    assert "\n" not in said
    # What to use instead: a runtime whose box's namespace the worker's proxy can listen in.
    assert 'may ask only for network "none" there' in said
    assert "TOOLQ_OCI_RUNTIME=runc or crun gives a run with an image a network" in said
