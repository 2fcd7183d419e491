"""Small images built here, with busybox-static and umoci: no registry, no network.

Each is an OCI layout whose image holds a static busybox and a few of its applets, an
``/etc/os-release`` that names the image, and whatever files a test adds.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import RedisServer, WorkerFleet, fleet_settings
from worker.images.mounts import is_mount

#: What a test needs to build and run images; a test without them skips, saying which.
NEEDED = ("umoci", "skopeo", "runc", "busybox", "catatonit")
BASE_APPLETS = ("sh", "cat", "echo", "ls", "id", "sleep", "mkdir", "touch", "rm", "kill", "ps")
#: A fixed amount of CPU work in an image's shell, whatever the wall time it takes: about 0.6 s of
#: CPU on this project's machines, twice the 300 ms a CPU limit is judged over.
BUSY_LOOP = "i=0; while [ $i -lt 600000 ]; do i=$((i+1)); done; echo counted"
#: A bash for Inspect's bash() tool (``bash --login -c ...``), which busybox has not: its sh.
BASH_SHIM = b'#!/bin/sh\n[ "$1" = --login ] && shift\nexec /bin/sh "$@"\n'
#: The libraries of glibc that Inspect's sandbox tools (a PyInstaller bundle linked against
#: glibc, carrying the rest) and bash load from the system, beside its loader.
GLIBC_LIBRARIES = (
    "libc.so.6",
    "libdl.so.2",
    "libpthread.so.0",
    "libm.so.6",
    "libutil.so.1",
    "librt.so.1",
    "libz.so.1",
    "libtinfo.so.6",
)


def all_applets() -> tuple[str, ...]:
    """Every applet of the host's busybox (what a fuller image links)."""
    listed = subprocess.run(
        ["busybox", "--list"], check=True, capture_output=True, text=True, timeout=30
    )
    return tuple(name for name in listed.stdout.split() if name != "busybox")


def glibc_files() -> dict[str, bytes]:
    """The host's glibc loader and ``GLIBC_LIBRARIES``, where the host has them, and its bash:
    what, added to busybox, makes an image run glibc programs as a Debian-based one does."""
    linked = subprocess.run(
        ["ldd", "/bin/bash"], check=True, capture_output=True, text=True, timeout=30
    )
    loader = next(line.split()[0] for line in linked.stdout.splitlines() if "ld-linux" in line)
    libc = next(line.split()[2] for line in linked.stdout.splitlines() if "libc.so" in line)
    folder = Path(libc).parent
    files = {loader: Path(loader).read_bytes(), "/bin/bash": Path("/bin/bash").read_bytes()}
    for name in GLIBC_LIBRARIES:
        files[str(folder / name)] = (folder / name).read_bytes()
    return files


def missing_programs(extra: Sequence[str] = ()) -> list[str]:
    return [name for name in (*NEEDED, *extra) if shutil.which(name) is None]


def skip_reason(extra: Sequence[str] = ()) -> str | None:
    """Why image tests cannot run here, or None."""
    if os.geteuid() != 0:
        return "images need a root sandbox worker (run the tests as root)"
    missing = missing_programs(extra)
    if missing:
        return (
            f"{', '.join(missing)} not installed (make install adds Debian's umoci, skopeo, "
            "runc, busybox-static and catatonit)"
        )
    return None


def build_image(
    layout: Path,
    tag: str,
    *,
    name: str,
    applets: Sequence[str] = BASE_APPLETS,
    files: Mapping[str, bytes] | None = None,
    env: Sequence[str] = ("PATH=/bin",),
    workdir: str | None = None,
    user: str | None = None,
    shell: bool = True,
    usr_bin: bool = False,
) -> str:
    """An image in the OCI layout ``layout`` (made if missing) tagged ``tag``; its reference."""
    umoci = shutil.which("umoci")
    assert umoci is not None
    if not (layout / "index.json").exists():
        _run(umoci, "init", "--layout", str(layout))
    _run(umoci, "new", "--image", f"{layout}:{tag}")
    bundle = layout.parent / f".bundle-{tag}"
    shutil.rmtree(bundle, ignore_errors=True)
    _run(umoci, "unpack", "--image", f"{layout}:{tag}", str(bundle))
    root = bundle / "rootfs"
    (root / "bin").mkdir(parents=True, exist_ok=True)
    (root / "etc").mkdir(exist_ok=True)
    (root / "tmp").mkdir(mode=0o1777, exist_ok=True)
    os.chmod(root / "tmp", 0o1777)
    busybox = shutil.which("busybox")
    assert busybox is not None
    shutil.copy2(busybox, root / "bin" / "busybox")
    if usr_bin:  # the applets in /usr/bin too, where a fuller system has them
        (root / "usr" / "bin").mkdir(parents=True)
    for applet in dict.fromkeys(applets):
        if applet == "sh" and not shell:
            continue
        os.symlink("busybox", root / "bin" / applet)
        if usr_bin:
            os.symlink("../../bin/busybox", root / "usr" / "bin" / applet)
    (root / "etc" / "os-release").write_text(f'NAME="{name}"\nID={name}\n')
    (root / "etc" / "passwd").write_text(
        "root:x:0:0:root:/root:/bin/sh\nagent:x:1000:1000:agent:/home/agent:/bin/sh\n"
    )
    (root / "etc" / "group").write_text("root:x:0:\nagent:x:1000:\n")
    (root / "root").mkdir(mode=0o700, exist_ok=True)
    (root / "home" / "agent").mkdir(parents=True, exist_ok=True)
    os.chown(root / "home" / "agent", 1000, 1000)
    for path, content in (files or {}).items():
        target = root / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
        target.chmod(0o755)
    _run(umoci, "repack", "--image", f"{layout}:{tag}", str(bundle))
    config = ["--image", f"{layout}:{tag}"]
    for entry in env:
        config += ["--config.env", entry]
    if workdir is not None:
        config += ["--config.workingdir", workdir]
    if user is not None:
        config += ["--config.user", user]
    _run(umoci, "config", *config)
    shutil.rmtree(bundle, ignore_errors=True)
    return f"oci:{layout}:{tag}"


def derive_image(layout: Path, base: str, tag: str, files: Mapping[str, bytes]) -> str:
    """An image tagged ``tag`` in ``layout``: the image tagged ``base`` there, its layers
    shared, and one layer more that adds ``files``; its reference."""
    umoci = shutil.which("umoci")
    assert umoci is not None
    _run(umoci, "tag", "--image", f"{layout}:{base}", tag)
    bundle = layout.parent / f".bundle-{tag}"
    shutil.rmtree(bundle, ignore_errors=True)
    _run(umoci, "unpack", "--image", f"{layout}:{tag}", str(bundle))
    for path, content in files.items():
        target = bundle / "rootfs" / path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(content)
    _run(umoci, "repack", "--image", f"{layout}:{tag}", str(bundle))
    shutil.rmtree(bundle, ignore_errors=True)
    return f"oci:{layout}:{tag}"


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True, timeout=120)


@dataclass(frozen=True)
class Images:
    """The tests' images, by what they are."""

    alpha: str
    beta: str
    agent: str
    noshell: str
    layout: Path


def build_test_images(layout: Path) -> Images:
    """alpha (busybox, an os-release saying so), beta (another tool, its own Env), agent (a
    non-root User and a WorkingDir with a file) and noshell (no /bin/sh)."""
    return Images(
        alpha=build_image(
            layout, "alpha", name="toolq-alpha", applets=(*BASE_APPLETS, "dd", "seq", "wc", "nc")
        ),
        beta=build_image(
            layout,
            "beta",
            name="toolq-beta",
            files={"/usr/bin/beta-tool": b"#!/bin/sh\necho beta tool here\n"},
            env=("PATH=/usr/bin:/bin", "GREETING=from-beta"),
        ),
        agent=build_image(
            layout,
            "agent",
            name="toolq-agent",
            files={"/app/hello.txt": b"hello from the image\n"},
            workdir="/app",
            user="agent",
        ),
        noshell=build_image(layout, "noshell", name="toolq-noshell", shell=False),
        layout=layout,
    )


@contextlib.contextmanager
def images_folder() -> Iterator[Path]:
    """A folder others may pass through (a box's root reaches its bundle through it), removed
    after with whatever a failed test left mounted below it."""
    root = Path(tempfile.mkdtemp(prefix="toolq-images-test-"))
    os.chmod(root, 0o711)
    try:
        yield root
    finally:
        unmount_below(root)
        shutil.rmtree(root, ignore_errors=True)


def unmount_below(root: Path) -> None:
    """Whatever is still mounted below ``root``, so that it can be removed."""
    with open("/proc/self/mountinfo") as info:
        points = [line.split()[4] for line in info]
    for point in sorted((p for p in points if p.startswith(str(root))), reverse=True):
        if is_mount(Path(point)):
            subprocess.run(["umount", "-l", point], check=False, capture_output=True, timeout=30)


def built_or_skip(extra: Sequence[str] = ()) -> Iterator[tuple[Path, Images]]:
    """For a module's fixture: the test images, built once in a folder of their own, or the
    module skipped, saying what is missing."""
    reason = skip_reason(extra)
    if reason is not None:
        pytest.skip(reason)
    with images_folder() as root:
        yield root, build_test_images(root / "layout")


@contextlib.contextmanager
def image_fleet(root: Path, redis_dir: Path, **overrides: object) -> Iterator[WorkerFleet]:
    """Both pools on a Redis of their own (the session's other fleets would take the runs'
    calls), their images cached below ``root``."""
    workspaces = root / f"workspaces-{uuid.uuid4().hex[:6]}"
    workspaces.mkdir()
    os.chmod(workspaces, 0o755)
    redis_server = RedisServer(redis_dir)
    redis_server.start()
    try:
        settings = fleet_settings(
            redis_server.url, workspaces, image_cache=root / "cache", **overrides
        )
        workers = WorkerFleet(settings).start()
        try:
            yield workers
        finally:
            workers.stop()
    finally:
        redis_server.stop()
