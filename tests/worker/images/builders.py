"""Small images built here, with busybox-static and umoci: no registry, no network.

Each is an OCI layout whose image holds a static busybox and a few of its applets, an
``/etc/os-release`` that names the image, and whatever files a test adds.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Mapping, Sequence
from pathlib import Path

#: What a test needs to build and run images; a test without them skips, saying which.
NEEDED = ("umoci", "skopeo", "runc", "busybox", "catatonit")
BASE_APPLETS = ("sh", "cat", "echo", "ls", "id", "sleep", "mkdir", "touch", "rm", "kill", "ps")


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
    for applet in applets:
        if applet == "sh" and not shell:
            continue
        os.symlink("busybox", root / "bin" / applet)
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


def _run(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)
