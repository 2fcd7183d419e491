"""A run's box from an image, with the real tools (umoci, skopeo, runc, catatonit): what its
commands see, what lasts between calls, the limits that hold inside, and what is left after."""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.worker.images.builders import Images
from tests.worker.images.conftest import MAX_PROCESSES, Host
from worker.contract.errors import EnvironmentLost, ImageError
from worker.images.boxes import BoxRecord
from worker.images.calls import run_in_box
from worker.images.mounts import is_mount
from worker.images.owner import Owner
from worker.images.sweep import sweep_boxes
from worker.plumbing.proc_stat import process_alive
from worker.sandbox.result import SandboxResult
from worker.tools.workspace import Workspace


def run(
    host: Host,
    workspace: Workspace,
    record: object,
    command: str,
    timeout_ms: int = 10_000,
    **options: object,
) -> SandboxResult:
    assert isinstance(record, BoxRecord)
    return run_in_box(
        host.boxes,
        record,
        command,
        cwd=workspace.root,
        env=options.pop("env", {}),  # type: ignore[arg-type]
        timeout_ms=timeout_ms,
        config=host.sandbox,
        **options,  # type: ignore[arg-type]
    )


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_a_command_sees_the_images_files_and_not_the_hosts(host: Host, images: Images) -> None:
    workspace, box = host.start("run-alpha", images.alpha)
    seen = run(host, workspace, box, "cat /etc/os-release; ls /usr/bin/python3 /etc/debian_version")
    assert 'NAME="toolq-alpha"' in seen.stdout
    assert "No such file" in seen.stderr  # the worker's own Python and Debian files are not there
    assert seen.isolation[0] == f"container:{host.boxes.settings.runtime}"
    assert isinstance(box, BoxRecord) and box.digest.startswith("sha256:")
    assert f"image:{box.digest}" in seen.isolation


def test_two_runs_with_different_images_each_see_their_own(host: Host, images: Images) -> None:
    alpha_ws, alpha = host.start("run-a", images.alpha)
    beta_ws, beta = host.start("run-b", images.beta)
    assert "toolq-alpha" in run(host, alpha_ws, alpha, "cat /etc/os-release").stdout
    answer = run(host, beta_ws, beta, "cat /etc/os-release; beta-tool; echo $GREETING")
    assert answer.stdout.splitlines()[-2:] == ["beta tool here", "from-beta"]
    assert "toolq-beta" in answer.stdout
    # Neither sees the other's tool, nor its files.
    assert run(host, alpha_ws, alpha, "beta-tool").exit_code == 127
    run(host, beta_ws, beta, "echo mine > /tmp/secret")
    assert run(host, alpha_ws, alpha, "cat /tmp/secret").exit_code != 0


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_state_lasts_from_one_call_to_the_next(host: Host, images: Images) -> None:
    workspace, box = host.start("run-state", images.alpha)
    # As pip install would: into the image's own folders, and into root's home.
    setup = "mkdir -p /usr/lib/site && echo installed > /usr/lib/site/pkg && echo 1 > ~/.rc"
    assert run(host, workspace, box, setup).exit_code == 0
    later = run(host, workspace, box, "cat /usr/lib/site/pkg ~/.rc; id -u")
    assert later.stdout == "installed\n1\n0\n"
    # The image itself is untouched: a new run starts from it afresh.
    other_ws, other = host.start("run-fresh", images.alpha)
    assert run(host, other_ws, other, "cat /usr/lib/site/pkg").exit_code != 0


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_the_workspace_is_the_same_folder_inside_and_outside(host: Host, images: Images) -> None:
    workspace, box = host.start("run-files", images.alpha)
    (workspace.root / "from-tools.txt").write_text("written by a tool\n")
    assert workspace.owner is not None
    os.chown(workspace.root / "from-tools.txt", *workspace.owner)
    answer = run(
        host,
        workspace,
        box,
        "pwd; cat from-tools.txt; echo more >> from-tools.txt; echo new > made.txt",
    )
    assert answer.stdout == "/workspace\nwritten by a tool\n"
    made = workspace.root / "made.txt"
    assert made.read_text() == "new\n"
    # Made in the box as its root: the run's own uid outside it.
    assert (made.stat().st_uid, made.stat().st_gid) == workspace.owner
    assert (workspace.root / "from-tools.txt").read_text().endswith("more\n")


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_an_images_user_and_working_dir_are_applied(host: Host, images: Images) -> None:
    workspace, box = host.start("run-agent", images.agent)
    answer = run(host, workspace, box, "id -u; pwd; cat hello.txt; echo hi > mine.txt")
    # gVisor's commands run as the box's root (the run's own uid all the same).
    user = "0" if host.boxes.settings.runtime == "runsc" else "1000"
    assert answer.stdout == f"{user}\n/app\nhello from the image\n"
    # What the image had at its WorkingDir came into the workspace, the run's own.
    assert (workspace.root / "hello.txt").read_text() == "hello from the image\n"
    assert workspace.owner is not None
    assert (workspace.root / "mine.txt").stat().st_uid == workspace.owner[0]
    # A task may say who runs instead.
    root_ws, as_root = host.start("run-agent-root", images.agent, user="root")
    assert run(host, root_ws, as_root, "id -u").stdout == "0\n"


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_a_timeout_kills_the_command_and_the_box_lives_on(host: Host, images: Images) -> None:
    workspace, box = host.start("run-timeout", images.alpha)
    slow = run(host, workspace, box, "echo started; sleep 30", timeout_ms=1000)
    assert slow.timed_out and slow.exit_code == -1
    assert slow.stdout == "started\n"
    assert "timed out after 1 s" in slow.stderr
    assert run(host, workspace, box, "echo still here").stdout == "still here\n"


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_what_a_command_leaves_running_is_killed_and_counted(host: Host, images: Images) -> None:
    workspace, box = host.start("run-leftovers", images.alpha)
    answer = run(host, workspace, box, "sleep 60 & sleep 60 & echo left two")
    assert answer.stdout == "left two\n"
    assert answer.usage.killed_processes == 2
    assert "sleep" not in run(host, workspace, box, "ps").stdout


def test_a_command_reaped_before_it_is_followed_ends_its_call_with_it(
    host: Host, images: Images, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A quick command on a busy machine can be gone before the worker opens its pidfd: its
    call ends then, what it left killed, not at the call's deadline (runc's exec, held open by
    the leftover, never ends by itself)."""
    workspace, box = host.start("run-quick", images.alpha)

    def reaped_first(pid: int, flags: int = 0) -> int:
        wait_for(lambda: not Path(f"/proc/{pid}").exists(), what=f"command {pid} reaped")
        raise ProcessLookupError(pid)

    monkeypatch.setattr(os, "pidfd_open", reaped_first)
    answer = run(host, workspace, box, "sleep 60 & echo left", timeout_ms=20_000)
    assert not answer.timed_out and answer.stdout == "left\n"
    assert answer.usage.killed_processes == 1


def test_the_memory_limit_holds_inside(host: Host, images: Images) -> None:
    workspace, box = host.start("run-memory", images.alpha)
    hog = run(host, workspace, box, "dd if=/dev/zero of=/dev/null bs=200M count=1")
    assert hog.exit_code != 0
    assert hog.usage.oom_killed
    assert run(host, workspace, box, "echo alive").stdout == "alive\n"


def test_the_process_limit_holds_inside(host: Host, images: Images) -> None:
    workspace, box = host.start("run-forks", images.alpha)
    many = run(
        host, workspace, box, f"for i in $(seq {MAX_PROCESSES * 2}); do sleep 5 & done; wait"
    )
    assert "can't fork" in many.stderr or "Resource temporarily unavailable" in many.stderr
    assert run(host, workspace, box, "echo alive").stdout == "alive\n"


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_what_listens_on_the_hosts_loopback_is_out_of_reach(host: Host, images: Images) -> None:
    # As a broker on the worker's host: the box's loopback is its own.
    with socket.create_server(("127.0.0.1", 0)) as broker:
        port = broker.getsockname()[1]
        workspace, box = host.start("run-broker", images.alpha)
        answer = run(host, workspace, box, f"nc -w 2 127.0.0.1 {port} </dev/null; echo $?")
        assert answer.stdout.strip().splitlines()[-1] != "0"
        broker.settimeout(0)
        with pytest.raises(BlockingIOError):
            broker.accept()


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_a_box_has_no_network_but_loopback(host: Host, images: Images) -> None:
    workspace, box = host.start("run-net", images.alpha)
    answer = run(host, workspace, box, "ls /sys/class/net")
    assert answer.stdout.split() == ["lo"]
    if host.boxes.settings.runtime == "runc":  # gVisor's own stack has loopback up itself
        up = run(host, workspace, box, "cat /sys/class/net/lo/operstate")
        assert up.stdout == "unknown\n"  # what loopback says when it is up


def test_input_environment_and_output_caps(host: Host, images: Images) -> None:
    workspace, box = host.start("run-io", images.alpha)
    answer = run(
        host,
        workspace,
        box,
        "cat; echo $FOO; dd if=/dev/zero bs=1k count=200 2>/dev/null | wc -c",
        env={"FOO": "bar"},
        stdin=b"from stdin\n",
    )
    assert answer.stdout == "from stdin\nbar\n204800\n"
    flood = run(host, workspace, box, "dd if=/dev/zero bs=1k count=200 2>/dev/null")
    assert flood.stdout_truncated


@pytest.mark.parametrize(
    ("reference", "cause"),
    [
        ("oci:{layout}:missing-tag", "unknown reference"),
        ("oci:/nonexistent/layout:latest", "does not exist on the sandbox worker"),
        ("oci:{layout}:noshell", "has no /bin/sh"),
        ("docker-archive:{corrupt}", "corrupt or unreadable"),
        ("not a reference", "not an image reference"),
    ],
)
def test_an_image_that_cannot_be_used_is_one_line_naming_it(
    host: Host, images: Images, tmp_path: Path, reference: str, cause: str
) -> None:
    corrupt = tmp_path / "corrupt.tar"
    corrupt.write_bytes(b"not a tar archive")
    image = reference.format(layout=images.layout, corrupt=corrupt)
    with pytest.raises(ImageError) as raised:
        host.start("run-bad", image)
    message = str(raised.value)
    assert message.startswith(f"image {image!r}: ")
    assert cause in message and "\n" not in message
    assert host.boxes.records() == []


def test_a_corrupt_layout_is_one_line(host: Host, images: Images) -> None:
    broken = host.root / "broken-layout"
    shutil.copytree(images.layout, broken, symlinks=True)
    index = json.loads((broken / "index.json").read_text())
    alpha = next(
        m
        for m in index["manifests"]
        if m["annotations"]["org.opencontainers.image.ref.name"] == "alpha"
    )
    manifest = json.loads((broken / "blobs/sha256" / alpha["digest"].split(":")[1]).read_text())
    (broken / "blobs/sha256" / manifest["layers"][0]["digest"].split(":")[1]).write_bytes(b"junk")
    with pytest.raises(ImageError) as raised:
        host.start("run-broken", f"oci:{broken}:alpha")
    assert str(raised.value).startswith(f"image 'oci:{broken}:alpha': ")


def test_a_cache_full_of_images_in_use_refuses_and_an_idle_one_is_evicted(
    host: Host, images: Images
) -> None:
    _, alpha = host.start("run-1", images.alpha)
    assert isinstance(alpha, BoxRecord)
    size = host.boxes.cache.images()[0].record.size_bytes
    # Room for one image only.
    host.boxes.cache.bound = size + size // 2
    with pytest.raises(ImageError, match="full of images in use"):
        host.start("run-2", images.beta)
    host.boxes.end("run-1", time.monotonic() + 30)
    _, beta = host.start("run-2", images.beta)
    assert isinstance(beta, BoxRecord)
    assert [i.record.digest for i in host.boxes.cache.images()] == [beta.digest]


@pytest.mark.parametrize("host", ["runc", "runsc"], indirect=True)
def test_an_ended_box_leaves_nothing(host: Host, images: Images) -> None:
    workspace, box = host.start("run-end", images.alpha)
    assert isinstance(box, BoxRecord)
    run(host, workspace, box, "sleep 60 &")
    bundle = host.boxes.folder / box.name
    assert is_mount(bundle / "rootfs")
    host.boxes.end("run-end", time.monotonic() + 30)
    assert not bundle.exists()
    assert not process_alive(box.init_pid)
    # runsc's delete goes on after the end returns (its sandbox has exited): waited for here.
    runtime = host.boxes.runtime(box.image)
    wait_for(lambda: runtime.state(box.name) is None, 30, "the runtime to forget the box")
    wait_for(
        lambda: not list(Path("/sys/fs/cgroup").glob(f"*{box.cgroups_path}")),
        30,
        "the box's control groups to go",
    )
    with pytest.raises(EnvironmentLost):
        run(host, workspace, box, "echo too late")


def test_the_sweep_ends_boxes_of_dead_workers_and_of_removed_workspaces(
    host: Host, images: Images
) -> None:
    _, orphan = host.start("run-orphan", images.alpha)
    gone_ws, gone = host.start("run-gone", images.alpha)
    kept_ws, kept = host.start("run-kept", images.alpha)
    assert isinstance(orphan, BoxRecord) and isinstance(gone, BoxRecord)
    # A worker that died: its record names a process that is no more.
    dead = Owner(worker="sandbox@gone", boot_id=orphan.owner.boot_id, pid=2**22 + 1, started=1)
    record_file = host.boxes.folder / orphan.name / "record.json"
    record_file.write_text(orphan.model_copy(update={"owner": dead}).model_dump_json())
    shutil.rmtree(gone_ws.root)
    assert sweep_boxes(host.boxes) == 2
    assert [r.run_id for r in host.boxes.records()] == ["run-kept"]
    for box in (orphan, gone):
        assert not process_alive(box.init_pid)
        assert not (host.boxes.folder / box.name).exists()
    assert run(host, kept_ws, kept, "echo fine").stdout == "fine\n"


def test_a_second_start_finds_the_box_started(host: Host, images: Images) -> None:
    workspace, first = host.start("run-again", images.alpha)
    run(host, workspace, first, "echo kept > /etc/mark")
    _, second = host.start("run-again", images.alpha)
    assert isinstance(first, BoxRecord) and isinstance(second, BoxRecord)
    assert second.name == first.name and second.init_pid == first.init_pid
    assert run(host, workspace, second, "cat /etc/mark").stdout == "kept\n"
