"""Images from a registry: Debian's docker-registry on loopback (basic auth), an image pushed to
it with skopeo, then a batch that pulls it by tag with the credentials of
``TOOLQ_REGISTRY_AUTH_FILE`` and records its digest; a registry that refuses or cannot be
reached, or a tag it does not have, fails the item in one line."""

from __future__ import annotations

import base64
import ctypes
import ctypes.util
import hashlib
import json
import secrets
import shutil
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from api.local.stack import free_port
from api.scripted.server import ScriptedServer
from tests.conftest import WorkerFleet, wait_for
from tests.e2e.test_batch_cli import run_batch, write_items
from tests.e2e.test_batch_images import env_for, item, model  # noqa: F401 (model: a fixture)
from tests.results_file import finished_records
from tests.worker.images.builders import Images, built_or_skip
from tests.worker.images.builders import image_fleet as fleet_of_images
from worker.contract.errors import ImageError
from worker.contract.image_reference import parse_reference
from worker.images.fetch import Tools

pytestmark = pytest.mark.e2e

USER, PASSWORD = "toolq", "not-a-secret"


@dataclass(frozen=True)
class Registry:
    host: str
    auth_file: Path
    #: The pushed image's reference, and the digest of its manifest in the registry.
    image: str
    digest: str


def bcrypt(password: str) -> str:
    """A bcrypt hash for the registry's htpasswd file, by the system's libcrypt."""
    libcrypt = ctypes.CDLL(ctypes.util.find_library("crypt") or "libcrypt.so.1")
    libcrypt.crypt.restype = ctypes.c_char_p
    alphabet = "./ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
    salt = "".join(secrets.choice(alphabet) for _ in range(22))
    hashed = libcrypt.crypt(password.encode(), f"$2b$10${salt}".encode())
    assert isinstance(hashed, bytes) and hashed.startswith(b"$2b$")
    return hashed.decode()


def _answers(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=1)
    except urllib.error.HTTPError:
        return True  # 401: it answers, and asks for credentials
    except OSError:
        return False
    return True


@pytest.fixture(scope="module")
def built() -> Iterator[tuple[Path, Images]]:
    yield from built_or_skip(("docker-registry",))


@pytest.fixture(scope="module")
def registry(built: tuple[Path, Images]) -> Iterator[Registry]:
    root, images = built
    folder = root / "registry"
    folder.mkdir()
    (folder / "htpasswd").write_text(f"{USER}:{bcrypt(PASSWORD)}\n")
    host = f"127.0.0.1:{free_port()}"
    (folder / "config.yml").write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "error"},
                "storage": {"filesystem": {"rootdirectory": str(folder / "data")}},
                "http": {"addr": host},
                "auth": {"htpasswd": {"realm": "toolq-test", "path": str(folder / "htpasswd")}},
            }
        )
    )
    registry_binary = shutil.which("docker-registry")
    assert registry_binary is not None
    server = subprocess.Popen(
        [registry_binary, "serve", str(folder / "config.yml")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        wait_for(lambda: _answers(f"http://{host}/v2/"), timeout=20, what="the registry")
        image = f"{host}/toolq/alpha:v1"
        creds = f"--dest-creds={USER}:{PASSWORD}"
        subprocess.run(
            ["skopeo", "copy", "--quiet", "--dest-tls-verify=false", creds, images.alpha,
             f"docker://{image}"],
            check=True,
            capture_output=True,
            timeout=120,
        )  # fmt: skip
        raw = subprocess.run(
            ["skopeo", "inspect", "--raw", "--tls-verify=false", f"--creds={USER}:{PASSWORD}",
             f"docker://{image}"],
            check=True,
            capture_output=True,
            timeout=60,
        ).stdout  # fmt: skip
        auth = base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        auth_file = folder / "auth.json"
        auth_file.write_text(json.dumps({"auths": {host: {"auth": auth}}}))
        yield Registry(host, auth_file, image, f"sha256:{hashlib.sha256(raw).hexdigest()}")
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.fixture(scope="module")
def registry_fleet(built: tuple[Path, Images], registry: Registry) -> Iterator[WorkerFleet]:
    root, _ = built
    with fleet_of_images(
        root,
        root,
        insecure_registries=[registry.host],
        registry_auth_file=registry.auth_file,
    ) as workers:
        yield workers


def test_a_batch_pulls_by_tag_and_records_the_digest(
    registry_fleet: WorkerFleet,
    registry: Registry,
    model: ScriptedServer,  # noqa: F811
    tmp_path: Path,
) -> None:
    source = write_items(
        tmp_path / "in.jsonl",
        [
            item("pulled", "os_release", image=registry.image),
            item("again", "os_release", image=registry.image),
            item("no-tag", "os_release", image=f"{registry.host}/toolq/alpha:nope"),
            item("unreachable", "os_release", image="127.0.0.1:1/toolq/alpha:v1"),
        ],
    )
    output = tmp_path / "out.jsonl"
    done = run_batch(source, output, env_for(registry_fleet, model), 2)
    assert "Finished: 2 ok, 2 error" in done.stderr, done.stderr
    records = {r["id"]: r for r in finished_records(output)}
    for item_id in ("pulled", "again"):
        record = records[item_id]
        assert record["status"] == "ok" and "toolq-alpha" in record["answer"]
        assert record["image"] == {"reference": registry.image, "digest": registry.digest}
    for item_id, cause in (("no-tag", "unknown reference"), ("unreachable", "cannot be reached")):
        error = records[item_id]["error"]
        assert error.startswith("image '") and cause in error and "\n" not in error


def test_a_registry_that_refuses_is_one_line(registry: Registry) -> None:
    ref = parse_reference(registry.image)
    without_credentials = Tools(insecure_registries=(registry.host,))
    with pytest.raises(ImageError) as raised:
        without_credentials.resolve(ref, time.monotonic() + 30)
    assert f"the registry {registry.host} refused the pull" in str(raised.value)
    with_credentials = Tools(registry.auth_file, (registry.host,))
    assert with_credentials.resolve(ref, time.monotonic() + 30) == registry.digest
