"""``toolq serve``: what it refuses before it listens."""

from __future__ import annotations

import socket

import pytest

from api.http.server import serve
from api.local import stack
from api.local.stack import free_port
from tests.api.http.conftest import api_settings


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.168.1.10", "example.com"])
def test_serve_refuses_a_reachable_address_without_a_token(
    host: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        serve(host, free_port(), settings=api_settings(api_token=None))
    assert stopped.value.code == 2
    error = capsys.readouterr().err
    assert f"refusing to listen on {host}" in error
    assert "TOOLQ_API_TOKEN" in error


def test_serve_on_a_port_in_use_stops_before_starting_a_local_stack(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def no_stack(*_: object, **__: object) -> None:
        raise AssertionError("a local stack was started")

    monkeypatch.setattr(stack, "fleet_for", no_stack)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stopped:
            serve("127.0.0.1", port, settings=api_settings(broker_url=None))
    assert stopped.value.code == 1
    assert capsys.readouterr().err == (
        f"error: cannot listen on 127.0.0.1:{port}: address already in use; choose another --port\n"
    )
