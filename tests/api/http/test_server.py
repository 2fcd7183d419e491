"""``toolq serve``: what it refuses before it listens."""

from __future__ import annotations

import pytest

from api.http.server import serve
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
