"""A run's ``network`` as written, what the operator allows, and the proxy's verdicts that need
no namespace: names resolved only where the run may reach them, addresses always refused."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import fakeredis
import pytest

from tests.worker.conftest import TEST_SECRET, request, worker_settings
from worker.contract.errors import NetworkRefused
from worker.contract.network import NetworkAllowance, NetworkPolicy
from worker.egress import rules
from worker.egress.rules import Guard, judge
from worker.executor import Executor
from worker.results import ResultStore

SETTING = "TOOLQ_NETWORK_ALLOWED"


@pytest.mark.parametrize(
    ("written", "wire"),
    [
        (None, "none"),
        ("none", "none"),
        ([], "none"),
        ("full", "full"),
        (["PyPI.org:443", "10.1.2.0/24:8080"], ["pypi.org:443", "10.1.2.0/24:8080"]),
        ("pypi.org:443,files.pythonhosted.org:*", ["pypi.org:443", "files.pythonhosted.org:*"]),
        (["[2001:db8::/32]:443"], ["[2001:db8::/32]:443"]),
    ],
)
def test_a_network_is_read_as_written(written: object, wire: object) -> None:
    assert NetworkPolicy.parse(written).wire() == wire


@pytest.mark.parametrize(
    ("written", "says"),
    [
        (["pypi.org"], "has no port"),
        (["pypi.org:99999"], "port must be"),
        (["not a host:80"], "neither a host name nor a CIDR"),
        ("everything", "has no port"),
        (42, "must be"),
        ([f"h{i}.example:1" for i in range(65)], "at most 64"),
    ],
)
def test_a_bad_network_is_one_line(written: object, says: str) -> None:
    with pytest.raises(NetworkRefused, match=says) as caught:
        NetworkPolicy.parse(written)
    assert "\n" not in str(caught.value)


def test_the_operator_allows_no_more_than_it_says() -> None:
    listed = NetworkPolicy.parse(["pypi.org:443", "10.1.2.0/25:8080"])
    assert (
        NetworkAllowance.parse(None, SETTING).refusal(NetworkPolicy.parse("none"), SETTING) is None
    )
    refusal = NetworkAllowance.parse("none", SETTING).refusal(NetworkPolicy.parse("full"), SETTING)
    assert refusal == 'network "full" is not allowed here (TOOLQ_NETWORK_ALLOWED=none)'
    assert NetworkAllowance.parse("list", SETTING).refusal(listed, SETTING) is None
    assert NetworkAllowance.parse("list", SETTING).refusal(NetworkPolicy.parse("full"), SETTING)
    assert (
        NetworkAllowance.parse("full", SETTING).refusal(NetworkPolicy.parse("full"), SETTING)
        is None
    )
    mirror = NetworkAllowance.parse("pypi.org:*,10.1.2.0/24:8080", SETTING)
    assert mirror.refusal(listed, SETTING) is None
    wider = NetworkPolicy.parse(["10.1.0.0/16:8080"])
    assert "10.1.0.0/16:8080 is not allowed here" in str(mirror.refusal(wider, SETTING))
    with pytest.raises(NetworkRefused, match=SETTING):
        NetworkAllowance.parse("pypi.org", SETTING)


def test_names_are_resolved_only_where_the_run_may_reach_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    def resolve(host: str, port: int) -> list[ipaddress.IPv4Address]:
        asked.append(host)
        return [ipaddress.IPv4Address("203.0.113.7")]

    monkeypatch.setattr(rules, "resolve", resolve)
    guard = Guard(frozenset())
    policy = NetworkPolicy.parse(["pypi.org:443"])
    assert judge(policy, guard, "pypi.org", 443).addresses == (
        ipaddress.IPv4Address("203.0.113.7"),
    )
    assert judge(policy, guard, "secret-data.attacker.example", 443).refusal is not None
    assert judge(policy, guard, "pypi.org", 80).refusal is not None
    assert asked == ["pypi.org"]


def test_a_name_that_resolves_to_the_broker_or_metadata_is_refused(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    broker = ipaddress.IPv4Address("198.51.100.9")
    found = [broker, ipaddress.IPv4Address("169.254.169.254")]
    monkeypatch.setattr(rules, "resolve", lambda host, port: found)
    verdict = judge(NetworkPolicy.parse("full"), Guard(frozenset({broker})), "rebind.example", 80)
    assert verdict.refusal == (
        "rebind.example resolves only to the broker, the metadata address, which no run reaches"
    )


@pytest.mark.parametrize(
    "address", ["127.0.0.1", "::1", "::ffff:127.0.0.1", "169.254.169.254", "fe80::1", "0.0.0.0"]
)
def test_no_list_reaches_the_host_or_metadata(address: str) -> None:
    policy = NetworkPolicy.parse(["0.0.0.0/0:*", "[::/0]:*"])
    assert judge(policy, Guard(frozenset()), address, 80).refusal is not None


def test_the_hosts_own_addresses_are_read() -> None:
    assert ipaddress.IPv4Address("127.0.0.1") in rules.host_addresses()


def test_a_worker_refuses_a_call_asking_more_network_than_the_fleet_allows(
    tmp_path: Path, client: fakeredis.FakeRedis
) -> None:
    # A message that says more than the fleet allows did not come from an orchestrator, which
    # refuses such a run before it starts: the worker runs nothing of it.
    executor = Executor(worker_settings(tmp_path), ResultStore(client, 60, TEST_SECRET), "w:1")
    body = request("write_file", {"path": "a.txt", "content": "hi"}, network="full")
    refused = executor.handle(body, "tools")
    assert refused.error_kind == "bad_request"
    assert 'network "full" is not allowed here (TOOLQ_NETWORK_ALLOWED=none)' in refused.output
    assert not (tmp_path / "run-1" / "a.txt").exists()
    allowed = Executor(
        worker_settings(tmp_path, network_allowed="full"),
        ResultStore(client, 60, TEST_SECRET),
        "w:1",
    ).handle(request("write_file", {"path": "a.txt", "content": "hi"}, network="full"), "tools")
    assert not allowed.is_error, allowed.output
