"""Inspect's sandbox tools (``bash_session()``, ``text_editor()``, ...) on the toolq sandbox.

Inspect writes a program of its own into the sandbox (``inspect-sandbox-tools``, a PyInstaller
bundle), starts its server with ``inspect-sandbox-tools start-server`` and then talks to it with
one ``exec`` per tool call, the request on standard input. The server must outlive the ``exec``
that started it, and it keeps each of its shells in a session of its own: the toolq sandbox
starts it in the run's kept shell session, whose processes and their descendants outlive every
call (``ToolqSandboxEnvironment.exec``).

The bundle is linked against glibc (Inspect ships a glibc build for amd64 and arm64 and fetches
a musl build for Alpine): an image with neither, a static busybox or a distroless static one,
cannot run it, which ``no_loader`` says in one line.
"""

from __future__ import annotations

#: What Inspect's injected tools are called, and their command that starts their server
#: (``inspect_ai.util._sandbox._cli``).
SANDBOX_TOOLS = "inspect-sandbox-tools"
START_SERVER = "start-server"
#: The runtime (gVisor's) whose containers hold no shell sessions, as a started container names it.
GVISOR = "runsc"
#: The shell's status for a program it could not run because a file was missing: for the
#: launcher Inspect has just written, its loader.
NOT_FOUND = 127
#: glibc's loaders for the architectures Inspect builds its tools for, and musl's.
LOADERS = ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1", "/lib/ld-musl-*.so.1")
#: Succeeds when the box has one of ``LOADERS`` (a pattern that matches nothing stays itself).
HAS_A_LOADER = f'for loader in {" ".join(LOADERS)}; do [ -e "$loader" ] && exit 0; done; exit 1'


def starts_a_server(cmd: list[str]) -> bool:
    """``cmd`` starts the server of Inspect's injected sandbox tools."""
    name = cmd[0].rsplit("/", 1)[-1] if cmd else ""
    return len(cmd) == 2 and cmd[1] == START_SERVER and name == SANDBOX_TOOLS


def no_loader(image: str) -> str:
    """Why Inspect's tools cannot run in ``image``, which has none of ``LOADERS``."""
    return (
        f"toolq: Inspect's sandbox tools (bash_session(), text_editor(), ...) cannot run in "
        f"image {image!r}: they are a program linked against glibc, and the image has no "
        f"glibc ({LOADERS[0]} or {LOADERS[1]}); use an image with glibc, such as a "
        "Debian- or Ubuntu-based one (python:3.12-slim), or Inspect's bash() and python() "
        "tools, which need only a shell"
    )
