"""The egress proxy: HTTP ``CONNECT`` (a tunnel, for https and anything else over TCP) and
plain HTTP requests with an absolute URL, served on an asyncio loop of one thread per worker
process. Each call with a network serves its own listener (``serve``) and counts what it allowed
and refused; ending it closes the listener and every connection it made.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from worker.contract.network import NetworkPolicy
from worker.egress.rules import Guard, judge

#: The largest request head read before the proxy decides.
MAX_HEAD = 64 * 1024
#: How long a client may take to send its request head, and a connection to be made.
HEAD_BOUND_S = 30.0
CONNECT_BOUND_S = 15.0
#: Connections one call may hold open at once through its proxy.
MAX_OPEN = 256
_CHUNK = 64 * 1024
#: Request headers meant for the proxy, never sent on.
_HOP_HEADERS = (b"proxy-connection", b"proxy-authorization", b"connection", b"keep-alive")


#: Distinct refusals a call's answer names; more are counted, not named.
MAX_NAMED_REFUSALS = 5


@dataclass
class Counts:
    """What one call's proxy allowed and refused, and the first refusals, each one line
    (``toolq refused HOST:PORT: why``): the command's client may show only a status code (curl's
    "CONNECT tunnel failed, response 403"), so the call's answer names them itself."""

    allowed: int = 0
    refused: int = 0
    refusals: list[str] = field(default_factory=list)

    def refuse(self, line: str) -> None:
        self.refused += 1
        if line not in self.refusals and len(self.refusals) < MAX_NAMED_REFUSALS:
            self.refusals.append(line)

    @property
    def notice(self) -> str:
        """What the call's stderr ends with: each refusal named, and how many more there were."""
        lines = list(self.refusals)
        unnamed = self.refused - len(lines)
        if lines and unnamed > 0:
            lines.append(f"toolq refused {unnamed} more connection(s) of this command")
        return "".join(line + "\n" for line in lines)


@dataclass
class Served:
    """One call's listener being served: its policy, its counts, its open connections."""

    policy: NetworkPolicy
    guard: Guard
    counts: Counts = field(default_factory=Counts)
    writers: set[asyncio.StreamWriter] = field(default_factory=set)
    server: asyncio.Server | None = None


_loop_lock = threading.Lock()
_loop: asyncio.AbstractEventLoop | None = None


def _proxy_loop() -> asyncio.AbstractEventLoop:
    """The worker process's proxy loop, started on the first call that needs it."""
    global _loop
    with _loop_lock:
        if _loop is None or not _loop.is_running():
            _loop = asyncio.new_event_loop()
            started = threading.Event()
            _loop.call_soon(started.set)
            threading.Thread(target=_loop.run_forever, name="toolq-egress", daemon=True).start()
            started.wait()
        return _loop


def serve(listener: socket.socket, policy: NetworkPolicy, guard: Guard) -> Served:
    """Serve ``listener`` (listening, made in the call's namespace) for a run of ``policy``."""
    served = Served(policy, guard)
    loop = _proxy_loop()

    async def start() -> None:
        served.server = await asyncio.start_server(
            lambda r, w: _handle(served, r, w), sock=listener, limit=MAX_HEAD
        )

    asyncio.run_coroutine_threadsafe(start(), loop).result()
    return served


def stop(served: Served) -> Counts:
    """Close the listener and every connection made through it; the call's counts."""

    async def close() -> None:
        if served.server is not None:
            served.server.close()
        for writer in list(served.writers):
            writer.transport.abort()

    asyncio.run_coroutine_threadsafe(close(), _proxy_loop()).result()
    return served.counts


async def _handle(
    served: Served, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
) -> None:
    served.writers.add(writer)
    upstream: asyncio.StreamWriter | None = None
    try:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), HEAD_BOUND_S)
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
            return
        target = _target(head)
        if target is None:
            await _answer(writer, 400, "toolq's proxy takes CONNECT host:port or http:// URLs")
            return
        host, port, forward = target
        if len(served.writers) > MAX_OPEN:
            why = f"toolq refused {host}:{port}: more than {MAX_OPEN} connections at once"
            served.counts.refuse(_printable(why))
            await _answer(writer, 429, why)
            return
        verdict = await asyncio.get_running_loop().run_in_executor(
            None, judge, served.policy, served.guard, host, port
        )
        if verdict.refusal is not None:
            why = f"toolq refused {host}:{port}: {verdict.refusal}"
            served.counts.refuse(_printable(why))
            await _answer(writer, 403, why)
            return
        served.counts.allowed += 1
        up_reader, upstream = await _connect(verdict.addresses, port)
        if upstream is None or up_reader is None:
            await _answer(writer, 502, f"toolq could not connect to {host}:{port}")
            return
        served.writers.add(upstream)
        if forward is None:
            writer.write(b"HTTP/1.1 200 Connection established\r\n\r\n")
        else:
            upstream.write(forward)
        await asyncio.gather(_pipe(reader, upstream), _pipe(up_reader, writer))
    except (OSError, asyncio.CancelledError):
        pass
    finally:
        for end in (writer, upstream):
            if end is not None:
                served.writers.discard(end)
                end.transport.abort()


async def _connect(
    addresses: tuple[object, ...], port: int
) -> tuple[asyncio.StreamReader | None, asyncio.StreamWriter | None]:
    for address in addresses:
        with contextlib.suppress(OSError, TimeoutError):
            return await asyncio.wait_for(
                asyncio.open_connection(str(address), port), CONNECT_BOUND_S
            )
    return None, None


def _target(head: bytes) -> tuple[str, int, bytes | None] | None:
    """The host and port a request head asks for, and for plain HTTP the head to send on (the
    request line in origin form, the proxy's headers dropped, the connection closed after)."""
    first, _, rest = head.partition(b"\r\n")
    parts = first.split(b" ")
    if len(parts) != 3:
        return None
    method, target, version = (p.decode("latin-1") for p in parts)
    if method.upper() == "CONNECT":
        where, _, port_text = target.rpartition(":")
        if not where or not port_text.isdigit():
            return None
        return where.strip("[]"), int(port_text), None
    url = urlsplit(target)
    if url.scheme.lower() != "http" or not url.hostname:
        return None
    try:
        port = url.port or 80
    except ValueError:
        return None
    path = url.path or "/"
    if url.query:
        path += "?" + url.query
    headers = [
        line
        for line in rest.split(b"\r\n")
        if line and line.split(b":", 1)[0].strip().lower() not in _HOP_HEADERS
    ]
    lines = [f"{method} {path} {version}".encode("latin-1"), *headers, b"Connection: close"]
    return url.hostname, port, b"\r\n".join(lines) + b"\r\n\r\n"


def _printable(text: str) -> str:
    """``text`` as one line of printable characters: a host name comes from the command."""
    return "".join(c if c.isprintable() else "?" for c in text)[:300]


async def _answer(writer: asyncio.StreamWriter, status: int, text: str) -> None:
    reasons = {400: "Bad Request", 403: "Forbidden", 429: "Too Many Requests", 502: "Bad Gateway"}
    body = (text + "\n").encode()
    writer.write(
        f"HTTP/1.1 {status} {reasons[status]}\r\nContent-Type: text/plain\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode()
        + body
    )
    with contextlib.suppress(OSError):
        await writer.drain()


async def _pipe(source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
    try:
        while chunk := await source.read(_CHUNK):
            sink.write(chunk)
            await sink.drain()
        if sink.can_write_eof():
            sink.write_eof()
    except OSError:
        sink.transport.abort()
