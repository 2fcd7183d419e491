"""``toolq serve``: what it refuses before it listens, and what it serves without a model."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from api.http.server import serve
from api.local import stack
from api.local.stack import free_port, worker_environment
from tests.api.http.conftest import api_settings
from tests.api.http.serving import Replica
from tests.conftest import WorkerFleet
from tests.e2e.commands import clean_env

TOKEN = "no-model-token"


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

    monkeypatch.setattr(stack, "local_fleet", no_stack)
    monkeypatch.setenv("OPENAI_API_KEY", "test")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        with pytest.raises(SystemExit) as stopped:
            serve("127.0.0.1", port, settings=api_settings(broker_url=None))
    assert stopped.value.code == 2
    assert capsys.readouterr().err == (
        f"error: cannot listen on 127.0.0.1:{port}: address already in use; choose another "
        "--port, or stop what listens there\n"
    )


@pytest.mark.integration
def test_serve_without_a_model_api_serves_all_but_runs(fleet: WorkerFleet, tmp_path: Path) -> None:
    env = clean_env() | worker_environment(fleet.settings) | {"TOOLQ_API_TOKEN": TOKEN}
    replica = Replica(env, tmp_path, "serve", TOKEN).start()
    try:
        run = replica.client.post("/v1/runs", json={"prompt": "hello"})
        batch = replica.client.post("/v1/batches", json={"items": [{"id": "a", "prompt": "hi"}]})
        tools = replica.client.get("/v1/tools")
        fleet_page = replica.client.get("/ui/page/fleet")
        runs_page = replica.client.get("/ui/page/runs")
    finally:
        replica.stop()
        replica.client.close()

    said = (
        "no model API configured, so this server starts no run or batch: OPENAI_API_KEY is not "
        "set: set it, or point OPENAI_BASE_URL at a server that needs no key (for example "
        "`toolq scripted-llm`); then start toolq serve again"
    )
    assert (run.status_code, run.json()) == (503, {"detail": said})
    assert (batch.status_code, batch.json()) == (503, {"detail": said})
    assert tools.status_code == 200
    assert "get_current_weather" in [tool["name"] for tool in tools.json()]
    assert fleet_page.status_code == 200 and "Pool <code>sandbox</code>" in fleet_page.text
    assert runs_page.status_code == 200
    assert said in replica.log()
