"""The host's sysctls a process-mode sandbox worker turns on (``worker.sandbox.hardening``): the
tests leave them as they found them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from worker.sandbox.hardening import NEEDED, SYSCTL_ROOT


def _path(name: str) -> str:
    return str(SYSCTL_ROOT.joinpath(*name.split(".")))


def read_host_sysctls() -> dict[str, str]:
    """Each sysctl of ``NEEDED`` as this host has it now."""
    found = {}
    for name in NEEDED:
        with contextlib.suppress(OSError), open(_path(name)) as file:
            found[name] = file.read().strip()
    return found


def host_is_hardened() -> bool:
    """Both sysctls are on already: a worker would neither set them nor refuse."""
    values = read_host_sysctls()
    return all(int(values.get(name, "-1")) >= least for name, least in NEEDED.items())


@contextlib.contextmanager
def host_sysctls_restored() -> Iterator[dict[str, str]]:
    """The sysctls as found (yielded), written back on leaving where they changed."""
    found = read_host_sysctls()
    try:
        yield found
    finally:
        for name, value in found.items():
            with contextlib.suppress(OSError), open(_path(name), "r+") as file:
                if file.read().strip() != value:
                    file.seek(0)
                    file.write(f"{value}\n")
