"""The broker and result store asked once before a command starts: each way of failing said in
one line naming the URL (its password hidden), the cause and what to check, within seconds."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import redis

from api.exceptions import FleetUnreachableError
from api.local.stack import free_port, redis_server_argv
from api.process.connections import check_connections
from tests.conftest import RedisServer, wait_for
from tests.rabbitmq import AMQP_URL, require_rabbitmq, with_wrong_password
from worker.contract.settings import FleetSettings

CHECK_LOGIN = "check the user name and password in the URL"
#: The checks' time limit where an answer is expected: a refusal told before it ran out was
#: told at once, not taken for a silent server (nor tried again until the limit).
PATIENCE_S = 30.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A port that accepts connections and never says a word."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        yield listener.getsockname()[1]


def refusal(settings: FleetSettings, timeout_s: float = PATIENCE_S) -> tuple[str, float]:
    started = time.monotonic()
    with pytest.raises(FleetUnreachableError) as refused:
        check_connections(settings, timeout_s)
    return str(refused.value), time.monotonic() - started


def test_a_broker_on_a_closed_port_is_refused_at_once() -> None:
    port = free_port()

    message, took = refusal(FleetSettings(broker_url=f"redis://127.0.0.1:{port}/0"))

    assert message == (
        f"cannot connect to the broker at redis://127.0.0.1:{port}/0 (TOOLQ_BROKER_URL): "
        "connection refused; check that it is running and listens on that host and port"
    )
    assert took < PATIENCE_S


def test_an_unknown_host_is_named() -> None:
    message, took = refusal(FleetSettings(broker_url="redis://:pw@toolq-broker.invalid:6379/0"))

    assert message == (
        "cannot connect to the broker at redis://:**@toolq-broker.invalid:6379/0 "
        "(TOOLQ_BROKER_URL): unknown host 'toolq-broker.invalid'; check the host name"
    )
    assert took < PATIENCE_S


@pytest.mark.parametrize("broker", ["redis://127.0.0.1:{port}/0", "amqp://u:pw@127.0.0.1:{port}//"])
def test_a_broker_that_never_answers_is_given_up_on_after_the_timeout(
    silent_port: int, broker: str
) -> None:
    url = broker.format(port=silent_port)
    settings = FleetSettings(broker_url=url, result_backend="redis://127.0.0.1:1/0")

    timeout_s = 1.5
    message, took = refusal(settings, timeout_s=timeout_s)

    shown = url.replace(":pw@", ":**@")
    assert message == (
        f"cannot connect to the broker at {shown} (TOOLQ_BROKER_URL): no answer within 1.5 s; "
        "check the host and port, and that no firewall drops the connection"
    )
    # Given up on after one wait of the limit, not two.
    assert 0.8 * timeout_s < took < 2 * timeout_s


def test_the_result_store_is_checked_when_it_is_another_server(redis_server: RedisServer) -> None:
    port = free_port()
    settings = FleetSettings(
        broker_url=redis_server.url, result_backend=f"redis://127.0.0.1:{port}/1"
    )

    message, _ = refusal(settings)

    assert message.startswith(
        f"cannot connect to the result store at redis://127.0.0.1:{port}/1 "
        "(TOOLQ_RESULT_BACKEND): connection refused"
    )


@pytest.mark.integration
def test_a_redis_that_refuses_the_password_says_so(tmp_path: Path) -> None:
    port = free_port()
    argv = [*redis_server_argv(port, tmp_path), "--requirepass", "right"]
    server = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        good = f"redis://:right@127.0.0.1:{port}/0"
        wait_for(lambda: _pings(good), what="redis-server to answer")
        check_connections(FleetSettings(broker_url=good))

        message, took = refusal(FleetSettings(broker_url=f"redis://:wrong@127.0.0.1:{port}/0"))
    finally:
        server.kill()
        server.wait(timeout=30)
    assert message.startswith(
        f"cannot connect to the broker at redis://:**@127.0.0.1:{port}/0 (TOOLQ_BROKER_URL): "
        "login refused ("
    )
    assert message.endswith(CHECK_LOGIN)
    assert "wrong" not in message
    assert took < PATIENCE_S


@pytest.mark.integration
def test_rabbitmq_that_refuses_the_login_says_so_at_once(redis_server: RedisServer) -> None:
    require_rabbitmq()
    wrong, shown = with_wrong_password()
    check_connections(FleetSettings(broker_url=AMQP_URL, result_backend=redis_server.url))

    message, took = refusal(FleetSettings(broker_url=wrong, result_backend=redis_server.url))

    assert message == (
        f"cannot connect to the broker at {shown} (TOOLQ_BROKER_URL): "
        f"login refused (403 ACCESS_REFUSED); {CHECK_LOGIN}"
    )
    assert took < PATIENCE_S


@pytest.mark.integration
def test_rabbitmq_without_the_virtual_host_says_which(redis_server: RedisServer) -> None:
    require_rabbitmq()
    url = urlsplit(AMQP_URL)._replace(path="/toolq-no-such-vhost").geturl()

    message, _ = refusal(FleetSettings(broker_url=url, result_backend=redis_server.url))

    assert "refused (530 NOT_ALLOWED - vhost toolq-no-such-vhost not found); check the URL" in (
        message
    )


def _pings(url: str) -> bool:
    client = redis.Redis.from_url(url)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()
