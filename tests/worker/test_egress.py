"""A run's network, attacked from inside the run: the proxy lets through what the run's list
names and nothing else; the broker, the host's own addresses, loopback of the host and the
metadata address stay out of reach whatever the list says; a connection that bypasses the proxy
finds no route; and every connection is counted in the call's usage."""

from __future__ import annotations

import ipaddress
import json
import os
import secrets
import shlex
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import fakeredis
import pytest

from tests.worker.conftest import (
    RUN_UIDS,
    TEST_SECRET,
    request,
    run_in_workspace,
    worker_settings,
)
from tests.worker.netns_server import Served, free_port, served_in_namespace
from worker.contract.network import NetworkPolicy
from worker.contract.sandbox_settings import SandboxSettings
from worker.egress.rules import Guard, judge
from worker.executor import Executor
from worker.results import ResultStore
from worker.sandbox import SandboxConfig, SandboxError, SandboxResult
from worker.sandbox.layers import describe_isolation
from worker.sandbox.start.ready_pool import launcher
from worker.tools.factory import prepare_workspace
from worker.tools.workspace import Workspace

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(os.geteuid() != 0, reason="test namespaces and a run's network need root"),
]
#: curl through the proxy the run's variables name: plain HTTP, and a CONNECT tunnel (-p).
CURL = "curl -s -S --max-time 20"


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[list[Served], Served]]:
    with served_in_namespace((free_port(), free_port())) as found:
        yield found


@pytest.fixture
def config(tmp_path: Path) -> Iterator[SandboxConfig]:
    root = tmp_path / "workspaces"
    root.mkdir()
    tmp_path.chmod(0o755)
    made = SandboxConfig(
        SandboxSettings(isolation="namespaces", uid_range=str(RUN_UIDS)), workspace_root=str(root)
    )
    try:
        describe_isolation(made)
    except SandboxError as exc:
        pytest.skip(f"no network namespaces here: {exc}")
    yield made
    launcher.release()


def run(
    config: SandboxConfig, workspace: Workspace, command: str, network: object
) -> SandboxResult:
    policy = NetworkPolicy.parse(network)
    return run_in_workspace(config, workspace, command, network=policy, timeout_ms=60_000)


def test_the_list_reaches_its_server_and_nothing_else(
    config: SandboxConfig, servers: tuple[list[Served], Served]
) -> None:
    (listed, unlisted), machine = servers
    workspace = prepare_workspace(Path(str(config.workspace_root)) / "run-list", config)
    # The machine's own end of the link is listed: an address of the host, refused anyway.
    network = [f"{listed.address}:{listed.port}", f"{machine.address}/32:*"]
    command = "; ".join(
        [
            f"{CURL} http://{listed.address}:{listed.port}/; echo",
            f"{CURL} -p http://{listed.address}:{listed.port}/; echo",
            f"{CURL} http://{unlisted.address}:{unlisted.port}/",
            f"{CURL} http://{machine.address}:{machine.port}/",
            # The run's own loopback is its own (NO_PROXY): no broker there; and through the
            # proxy, the host's loopback is refused, by address and by name.
            f"{CURL} http://127.0.0.1:6379/ || echo no broker on the loopback of the run",
            f"{CURL} --noproxy '' http://127.0.0.1:6379/",
            f"{CURL} --noproxy '' http://localhost:6379/",
            f"{CURL} http://169.254.169.254/latest/meta-data/",
            f"{CURL} --noproxy '' http://[::ffff:127.0.0.1]:6379/",
            f"{CURL} -p http://[::ffff:127.0.0.1]:6379/ || echo tunnel refused",
        ]
    )
    result = run(config, workspace, command, network)
    out = result.stdout
    lines = out.splitlines()
    assert lines[0] == listed.body and lines[1] == listed.body, (out, result.stderr)
    assert unlisted.body not in out and machine.body not in out
    assert f"{unlisted.port} is not in this run's network list" in out
    assert f"{machine.address} is an address of the worker's host" in out
    assert "no broker on the loopback of the run" in out
    assert out.count("127.0.0.1 is the broker, which no run reaches") == 2
    assert "localhost resolves only to" not in out  # not listed: never resolved
    assert "localhost:6379 is not in this run's network list" in out
    assert "169.254.169.254 is the metadata address" in out
    assert "tunnel refused" in out
    usage = result.usage
    assert (usage.network_allowed, usage.network_refused) == (2, 7)


def test_full_reaches_anything_but_the_broker_the_host_and_metadata(
    config: SandboxConfig, servers: tuple[list[Served], Served]
) -> None:
    (_listed, unlisted), machine = servers
    workspace = prepare_workspace(Path(str(config.workspace_root)) / "run-full", config)
    command = "; ".join(
        [
            f"{CURL} http://{unlisted.address}:{unlisted.port}/; echo",
            f"{CURL} --noproxy '' http://localhost:6379/",
            f"{CURL} http://{machine.address}:{machine.port}/",
            f"{CURL} http://169.254.169.254/",
        ]
    )
    result = run(config, workspace, command, "full")
    out = result.stdout
    assert out.splitlines()[0] == unlisted.body, (out, result.stderr)
    assert "localhost resolves only to" in out
    assert machine.body not in out and "an address of the worker's host" in out
    assert "169.254.169.254 is the metadata address" in out
    usage = result.usage
    assert (usage.network_allowed, usage.network_refused) == (1, 3)


def test_a_connection_that_bypasses_the_proxy_finds_no_route(
    config: SandboxConfig, servers: tuple[list[Served], Served]
) -> None:
    (listed, _), machine = servers
    workspace = prepare_workspace(Path(str(config.workspace_root)) / "run-raw", config)
    targets = [(listed.address, listed.port), (machine.address, machine.port), ("127.0.0.1", 6379)]
    probes = "; ".join(
        f"/usr/bin/python3 -c 'import socket; socket.create_connection((\"{h}\", {p}), 5)' "
        f"2>/dev/null && echo reached {h} || echo blocked {h}"
        for h, p in targets
    )
    no_proxy = f"env -u HTTP_PROXY -u http_proxy -u ALL_PROXY -u all_proxy {CURL} "
    command = f"{probes}; {no_proxy}http://{listed.address}:{listed.port}/ || echo curl-blocked"
    result = run(config, workspace, command, [f"{listed.address}:{listed.port}"])
    out = result.stdout
    assert "reached" not in out and listed.body not in out, out
    assert out.count("blocked") == 4, (out, result.stderr)


def test_a_run_without_network_has_no_proxy_and_no_counts(
    config: SandboxConfig, servers: tuple[list[Served], Served]
) -> None:
    (listed, _), _machine = servers
    workspace = prepare_workspace(Path(str(config.workspace_root)) / "run-none", config)
    result = run(
        config,
        workspace,
        f"env | grep -ci proxy; {CURL} http://{listed.address}:{listed.port}/",
        "none",
    )
    assert listed.body not in result.stdout
    assert result.stdout.splitlines()[0] == "0"
    assert result.usage.network_allowed is None


def test_process_mode_refuses_a_list_it_cannot_hold(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    root.mkdir()
    tmp_path.chmod(0o755)
    config = SandboxConfig(
        SandboxSettings(isolation="process", uid_range=str(RUN_UIDS)), workspace_root=str(root)
    )
    workspace = prepare_workspace(root / "run-process", config)
    try:
        with pytest.raises(SandboxError, match="network"):
            run(config, workspace, "echo ran", ["pypi.org:443"])
    finally:
        launcher.release()


def test_a_calls_network_on_the_wire_reaches_its_command(
    tmp_path: Path, servers: tuple[list[Served], Served]
) -> None:
    # The whole worker path: the request's network, the worker's TOOLQ_NETWORK_ALLOWED, the
    # call's runtime, run_bash, the proxy, and the counts in the answer's usage.
    (listed, _), _machine = servers
    tmp_path.chmod(0o755)
    settings = worker_settings(tmp_path / "workspaces", network_allowed="list")
    executor = Executor(settings, ResultStore(fakeredis.FakeRedis(), 60, TEST_SECRET), "w:1")
    try:
        url = f"http://{listed.address}:{listed.port}/"
        body = request(
            "run_bash",
            {"command": f"{CURL} {url}"},
            network=[f"{listed.address}:{listed.port}"],
            timeout_ms=60_000,
        )
        answer = executor.handle(body, "sandbox")
        assert not answer.is_error, answer.output
        assert json.loads(answer.output)["stdout"] == listed.body
        assert answer.usage is not None
        assert (answer.usage.network_allowed, answer.usage.network_refused) == (1, 0)
    finally:
        launcher.release()


def test_a_refused_connection_is_named_in_one_line_of_the_calls_stderr(
    config: SandboxConfig, servers: tuple[list[Served], Served]
) -> None:
    # curl through a CONNECT tunnel shows only "response 403": the answer names what and why.
    (listed, unlisted), _machine = servers
    workspace = prepare_workspace(Path(str(config.workspace_root)) / "run-said", config)
    command = f"{CURL} -p http://{unlisted.address}:{unlisted.port}/ 2>/dev/null; echo exit $?"
    result = run(config, workspace, command, [f"{listed.address}:{listed.port}"])
    assert result.stdout == "exit 56\n", (result.stdout, result.stderr)
    where = f"{unlisted.address}:{unlisted.port}"
    assert result.stderr == f"toolq refused {where}: {where} is not in this run's network list\n"


def test_names_are_resolved_by_the_proxy_and_never_in_the_run(
    config: SandboxConfig, servers: tuple[list[Served], Served]
) -> None:
    workspace = prepare_workspace(Path(str(config.workspace_root)) / "run-dns", config)
    resolve = "import socket, sys; socket.getaddrinfo(sys.argv[1], 443)"
    command = "; ".join(
        [
            # The run asks a resolver itself: nothing answers it, whatever the list holds.
            f"/usr/bin/python3 -c '{resolve}' pypi.org 2>&1 | tail -1",
            # Through the proxy, a listed name is resolved by the worker: this one is the
            # machine's own (loopback), refused as its address would be.
            f"{CURL} -p --noproxy '' https://localhost:443/ 2>/dev/null || echo refused",
            # An unlisted name is refused before anything resolves it.
            f"{CURL} -p https://exfiltrated.example:443/ 2>/dev/null || echo refused",
        ]
    )
    result = run(config, workspace, command, ["pypi.org:443", "localhost:443"])
    said = result.stdout.splitlines()
    assert said[0].startswith("socket.gaierror:"), result.stdout
    assert said[1:] == ["refused", "refused"]
    resolved, unlisted = result.stderr.splitlines()
    # The worker resolved the listed name (here to the broker's and the host's loopback).
    assert resolved.startswith("toolq refused localhost:443: localhost resolves only to ")
    assert resolved.endswith(", which no run reaches")
    assert unlisted == (
        "toolq refused exfiltrated.example:443: exfiltrated.example:443 is not in this run's "
        "network list"
    )


@pytest.mark.parametrize("network", ["list", "full"])
def test_udp_reaches_nothing_whatever_the_network(
    config: SandboxConfig, servers: tuple[list[Served], Served], network: str
) -> None:
    (listed, _), machine = servers
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as receiver:
        receiver.bind((machine.address, 0))
        receiver.setblocking(False)
        port = receiver.getsockname()[1]
        targets = [(listed.address, listed.port), (machine.address, port), ("8.8.8.8", 53)]
        send = (
            "import socket, sys\n"
            "s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
            "try:\n"
            "    s.sendto(b'out', (sys.argv[1], int(sys.argv[2]))); print('sent')\n"
            "except OSError as e:\n"
            "    print(e.strerror)\n"
        )
        command = "; ".join(
            f'/usr/bin/python3 -c "$SEND" {host} {target_port}' for host, target_port in targets
        )
        wide = [f"{listed.address}/30:*", f"{machine.address}/32:*", "8.8.8.8/32:*"]
        policy = wide if network == "list" else "full"
        workspace = prepare_workspace(
            Path(str(config.workspace_root)) / f"run-udp-{network}", config
        )
        result = run(config, workspace, f"export SEND={shlex.quote(send)}; {command}", policy)
        assert result.stdout.splitlines() == ["Network is unreachable"] * 3, result.stderr
        with pytest.raises(BlockingIOError):  # the run has ended: anything sent is here now
            receiver.recv(64)
    assert result.usage.network_allowed == 0 and result.usage.network_refused == 0


def test_an_address_the_host_gained_a_moment_ago_is_refused_at_once() -> None:
    guard = Guard(frozenset())
    address = ipaddress.ip_address(f"10.215.{secrets.randbelow(256)}.{secrets.randbelow(254) + 1}")
    wide = NetworkPolicy.parse(["10.215.0.0/16:*"])
    assert guard.never(address) is None  # read before the interface exists
    link = f"tqd{secrets.token_hex(3)}"
    subprocess.run(
        ["ip", "link", "add", link, "type", "veth", "peer", "name", f"{link}p"],
        check=True,
        timeout=30,
    )
    try:
        subprocess.run(["ip", "addr", "add", f"{address}/32", "dev", link], check=True, timeout=30)
        verdict = judge(wide, guard, str(address), 80)
        assert (
            verdict.refusal == f"{address} is an address of the worker's host, which no run reaches"
        )
    finally:
        subprocess.run(["ip", "link", "del", link], check=True, timeout=30)
