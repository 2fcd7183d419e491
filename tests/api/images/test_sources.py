"""Where a token's run may take its image from, with a tokens file: tried as a tenant who wants
the sandbox workers to reach the worker's loopback, the cloud's metadata address, a private
registry or the worker host's files. Each refusal is one line, the same whatever is there, and
nothing is connected to; the operator's own runs keep their freedom."""

from __future__ import annotations

import socketserver
import threading
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import fakeredis
import httpx
import pytest

from api.exceptions import ImageUnavailable
from api.http.app import create_app
from api.images.sources import is_public, tenant_image_refusal
from api.runs.environment import RunEnvironment
from tests.api.http.conftest import FLEET, StubExecutor, api_settings, fake_redis, serving
from worker.contract.image_sources import ImageSources

TENANT = "alice-0123456789abcdef"


def refused(image: str) -> str:
    cause = "not a source this fleet takes images from (TOOLQ_IMAGE_SOURCES names those)"
    return f"image {image!r}: {cause}"


class Listener(socketserver.ThreadingTCPServer):
    """A TCP listener on loopback that notes whoever connects to it."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), socketserver.BaseRequestHandler)
        self.connections: list[object] = []

    def verify_request(self, request: Any, client_address: Any) -> bool:
        self.connections.append(client_address)
        return False


@pytest.fixture
def listener() -> Iterator[Listener]:
    server = Listener()
    serving_thread = threading.Thread(target=server.serve_forever, daemon=True)
    serving_thread.start()
    yield server
    server.shutdown()
    server.server_close()
    serving_thread.join(timeout=10)


@pytest.fixture
def private_paths(tmp_path: Path) -> dict[str, str]:
    """A path that holds a (corrupt) archive, and one where nothing is."""
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(b"not a tar archive")
    return {"corrupt": str(corrupt), "missing": str(tmp_path / "missing.tar")}


@pytest.mark.parametrize(
    "image",
    [
        "127.0.0.1:{port}/probe:1",
        "localhost:{port}/probe:1",
        "2130706433:{port}/probe:1",  # 127.0.0.1 written as one number
        "0x7f.1:{port}/probe:1",
        "169.254.169.254/latest/meta-data:1",
        "10.0.0.5:5000/team/app:1",
        "192.168.1.10/app",
        "100.64.0.1/app",
        "no-such-host.invalid:5000/app:1",
        "oci:{corrupt}:x",
        "docker-archive:{corrupt}",
        "docker-archive:{missing}",
        "oci-archive:/etc/passwd",
    ],
)
async def test_no_allowlist_refuses_host_paths_and_addresses_that_are_not_public(
    listener: Listener, private_paths: dict[str, str], image: str
) -> None:
    reference = image.format(port=listener.server_address[1], **private_paths)
    assert await tenant_image_refusal(reference, ImageSources()) == refused(reference)
    assert listener.connections == []


@pytest.mark.parametrize(
    ("image", "sources", "allowed"),
    [
        ("8.8.8.8:5000/team/app:1", (), True),  # public: allowed where nothing is named
        ("127.0.0.1:5000/probe:1", ("127.0.0.1:5000",), True),  # named by the operator
        ("127.0.0.1:5000/probe:1", ("127.0.0.1:5001",), False),
        ("oci:/srv/images/swe:1", ("oci:/srv/images",), True),
        ("oci:/srv/images/../../etc:1", ("oci:/srv/images",), False),
        ("oci:/srv/imagesx/swe:1", ("oci:/srv/images",), False),
        ("8.8.8.8:5000/team/app:1", ("ghcr.io/acme",), False),  # a list names all there is
        ("ghcr.io/acme/app:1", ("ghcr.io/acme",), True),
        ("ghcr.io/acmex/app:1", ("ghcr.io/acme",), False),
    ],
)
async def test_what_the_allowlist_names_is_allowed_and_only_that(
    image: str, sources: tuple[str, ...], allowed: bool
) -> None:
    found = await tenant_image_refusal(image, ImageSources.parse(sources))
    assert found == (None if allowed else refused(image))


@pytest.mark.parametrize(
    ("address", "public"),
    [
        ("8.8.8.8", True),
        ("2001:4860:4860::8888", True),
        ("127.0.0.1", False),
        ("::1", False),
        ("::ffff:127.0.0.1", False),
        ("::ffff:10.0.0.1", False),
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("fe80::1%eth0", False),
        ("fd00::1", False),
        ("224.0.0.1", False),
        ("0.0.0.0", False),
    ],
)
def test_public_addresses_are_told_from_the_others(address: str, public: bool) -> None:
    assert is_public(address) is public


@pytest.fixture
def stub() -> StubExecutor:
    return StubExecutor()


@pytest.fixture
def fake_server() -> fakeredis.FakeServer:
    return fakeredis.FakeServer()


@pytest.fixture
async def client(
    stub: StubExecutor, fake_server: fakeredis.FakeServer
) -> AsyncIterator[httpx.AsyncClient]:
    """The operator's API: one token, no tokens file."""
    app = create_app(api_settings(), redis=fake_redis(fake_server), executor=lambda *_: stub)
    async with serving(app) as api:
        yield api


@pytest.fixture
async def tenant_client(
    tmp_path: Path, stub: StubExecutor, fake_server: fakeredis.FakeServer
) -> AsyncIterator[httpx.AsyncClient]:
    tokens = tmp_path / "tokens"
    tokens.write_text(f"alice {TENANT}\n")
    settings = api_settings(api_token=None, api_tokens_file=tokens)
    app = create_app(settings, redis=fake_redis(fake_server), executor=lambda *_: stub)
    async with serving(app, {"Authorization": f"Bearer {TENANT}"}) as client:
        yield client


async def test_a_tokens_run_with_a_loopback_registry_is_refused_before_it_is_queued(
    tenant_client: httpx.AsyncClient, stub: StubExecutor, listener: Listener
) -> None:
    image = f"127.0.0.1:{listener.server_address[1]}/probe:1"
    response = await tenant_client.post(
        "/v1/runs", json={"prompt": "hi", "options": {"image": image}}
    )
    assert response.status_code == 422
    assert response.json()["detail"] == f"options.image: {refused(image)}"
    assert stub.runs == [] and listener.connections == []


async def test_a_tokens_batch_names_each_item_whose_path_is_refused_alike(
    tenant_client: httpx.AsyncClient, stub: StubExecutor, private_paths: dict[str, str]
) -> None:
    items = [
        {"id": "a", "prompt": "hi", "image": f"docker-archive:{private_paths['corrupt']}"},
        {"id": "b", "prompt": "hi", "image": f"docker-archive:{private_paths['missing']}"},
        {"id": "c", "prompt": "hi"},
    ]
    response = await tenant_client.post("/v1/batches", json={"items": items})
    assert response.status_code == 422
    errors = response.json()["errors"]
    assert [(e["field"], e["message"]) for e in errors] == [
        (f"items.{index}.image", refused(items[index]["image"])) for index in (0, 1)
    ]
    assert stub.batches == []


async def test_the_operators_api_without_a_tokens_file_keeps_its_freedom(
    client: httpx.AsyncClient, stub: StubExecutor
) -> None:
    for image in ("127.0.0.1:5000/probe:1", "oci:/srv/layouts/x:1"):
        response = await client.post("/v1/runs", json={"prompt": "hi", "options": {"image": image}})
        assert response.status_code == 202, response.text
    assert [options.image for _, _, options in stub.runs] == [
        "127.0.0.1:5000/probe:1",
        "oci:/srv/layouts/x:1",
    ]


async def test_an_mcp_sessions_image_is_refused_before_any_worker_is_asked() -> None:
    """A session's container (MCP over HTTP with tokens) is looked at before its start is sent:
    the answer is the refusal, not what a worker would say."""
    image = "169.254.169.254/latest:1"
    environment = RunEnvironment(
        None,  # type: ignore[arg-type]  # nothing is sent: no dispatcher is needed
        FLEET,
        "mcp-run",
        image,
        vet=lambda text: tenant_image_refusal(text, ImageSources()),
    )
    with pytest.raises(ImageUnavailable) as raised:
        await environment.start()
    assert str(raised.value) == refused(image)
