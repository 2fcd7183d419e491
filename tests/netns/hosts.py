"""Test hosts on one machine: network namespaces on a private bridge, and processes run in them.

Every host is a network namespace with one end of a veth pair; the other ends are ports of a
bridge the network creates. The machine itself gets no address on that bridge, so the hosts reach
each other and nothing else. The network is IPv4 only: IPv6 link-local addresses would otherwise
connect every host to every other (and to the machine), whatever the IPv4 routes say.
"""

from __future__ import annotations

import contextlib
import os
import random
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Private addresses: each network takes one random /24 of 10.213.0.0/16. Two networks that pick
#: the same /24 do not clash: each has its own bridge, and no address is on the machine itself.
ADDRESS_PREFIX = "10.213"
STOP_BOUND_S = 5.0
COMMAND_TIMEOUT_S = 30.0

_CONNECT = """
import socket, sys, time
address, port, patience = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
deadline = time.monotonic() + patience
while True:
    try:
        socket.create_connection((address, port), timeout=2).close()
        break
    except OSError as exc:
        if time.monotonic() >= deadline:
            sys.exit(str(exc))
        time.sleep(0.05)
"""
#: Writing "all" turns IPv6 off on the interfaces already there, "default" on those to come.
_IPV6_OFF = """
for knob in all default; do
    file=/proc/sys/net/ipv6/conf/$knob/disable_ipv6
    [ ! -e "$file" ] || echo 1 > "$file" || exit 1
done
"""


class NetworkError(RuntimeError):
    """A step of building or removing the test network failed; the message has ip's words."""


@dataclass(frozen=True)
class Host:
    """One test host: a network namespace with one address on the test network."""

    role: str
    namespace: str
    address: str
    interface: str
    #: The host name its processes see when started with ``uts=True``.
    hostname: str

    def command(self, *argv: str) -> list[str]:
        """``argv`` as run inside this host."""
        return ["ip", "netns", "exec", self.namespace, *argv]

    def run(
        self,
        *argv: str,
        env: Mapping[str, str] | None = None,
        timeout: float = COMMAND_TIMEOUT_S,
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*argv),
            capture_output=True,
            text=True,
            env=None if env is None else dict(env),
            timeout=timeout,
            check=False,
        )

    def connect_error(self, address: str, port: int, *, patience_s: float = 0.0) -> str | None:
        """None when a TCP connection from this host to ``address:port`` works, else the error.

        With ``patience_s`` it tries again until then (for a server that is starting).
        """
        done = self.run(
            sys.executable,
            "-c",
            _CONNECT,
            address,
            str(port),
            str(patience_s),
            timeout=patience_s + COMMAND_TIMEOUT_S,
        )
        return None if done.returncode == 0 else done.stderr.strip() or f"exit {done.returncode}"

    def cut(self) -> None:
        """Pull the cable: the host's link goes down, its connections stop mid-stream."""
        _ip("-n", self.namespace, "link", "set", self.interface, "down")

    def reconnect(self) -> None:
        _ip("-n", self.namespace, "link", "set", self.interface, "up")


@dataclass
class Started:
    """A process started in a host; it leads its own process group (a worker and its children)."""

    label: str
    host: Host
    process: subprocess.Popen[bytes]
    log_path: Path

    def log_tail(self, lines: int = 40) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


@dataclass
class Network:
    """``with Network() as net: net.add_host("broker")``; everything is removed on exit."""

    suffix: str = field(default_factory=lambda: secrets.token_hex(3))
    subnet: str = field(default_factory=lambda: f"{ADDRESS_PREFIX}.{random.randrange(1, 255)}")
    hosts: dict[str, Host] = field(default_factory=dict)
    log_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="toolq-netns-")))
    _namespaces: list[str] = field(default_factory=list)
    _links: list[str] = field(default_factory=list)
    _started: list[Started] = field(default_factory=list)

    @property
    def bridge(self) -> str:
        return f"tq{self.suffix}br"

    def __enter__(self) -> Network:
        try:
            self._links.append(self.bridge)
            _ip("link", "add", self.bridge, "type", "bridge")
            _disable_ipv6_on(self.bridge)
            _ip("link", "set", self.bridge, "up")
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def add_host(self, role: str, *, reach_only: Host | None = None) -> Host:
        """A new host on the network; with ``reach_only`` it has a route to that host alone.

        Such a host holds a /32 address and one /32 route: no subnet route, no default route.
        Packets to any other address fail with "Network is unreachable" before they leave, and
        it cannot answer anyone else either.
        """
        number = len(self.hosts) + 2  # .1 stays unused: no gateway, the machine is not on it
        host = Host(
            role=role,
            namespace=f"toolq-{self.suffix}-{role}",
            address=f"{self.subnet}.{number}",
            interface=f"tq{self.suffix}n{number}",
            hostname=f"tq{self.suffix}-{role}",
        )
        outside = f"tq{self.suffix}h{number}"
        # Recorded before each step, so that close() removes whatever half of it was made.
        self._namespaces.append(host.namespace)
        _ip("netns", "add", host.namespace)
        self._links.append(outside)
        _ip("link", "add", outside, "type", "veth", "peer", "name", host.interface)
        _ip("link", "set", host.interface, "netns", host.namespace)
        _disable_ipv6_on(outside)
        _ip("link", "set", outside, "master", self.bridge, "up")
        inside = ("-n", host.namespace)
        done = host.run("sh", "-c", _IPV6_OFF)
        if done.returncode != 0:
            raise NetworkError(f"cannot turn IPv6 off in {host.namespace}: {done.stderr.strip()}")
        _ip(*inside, "link", "set", "lo", "up")
        prefix = 32 if reach_only is not None else 24
        _ip(*inside, *f"addr add {host.address}/{prefix} dev {host.interface}".split())
        _ip(*inside, "link", "set", host.interface, "up")
        if reach_only is not None:
            route = f"route add {reach_only.address}/32 dev {host.interface} src {host.address}"
            _ip(*inside, *route.split())
        self.hosts[role] = host
        return host

    def start(
        self,
        host: Host,
        label: str,
        argv: Sequence[str],
        *,
        env: Mapping[str, str],
        uts: bool = False,
    ) -> Started:
        """Start ``argv`` in ``host``; with ``uts`` it sees the host's own host name.

        The namespaces share the machine's host name unless given their own UTS namespace, so
        ``uts`` is what makes ``socket.gethostname()`` name the test host.
        """
        command = list(argv)
        if uts:
            command = [
                "unshare",
                "--uts",
                "--",
                "sh",
                "-c",
                'hostname "$0" && exec "$@"',
                host.hostname,
                *command,
            ]
        log_path = self.log_dir / f"{label}.log"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                host.command(*command),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=dict(env),
                start_new_session=True,
            )
        started = Started(label, host, process, log_path)
        self._started.append(started)
        return started

    def stop(self, started: Started) -> None:
        """SIGTERM, then SIGKILL to its whole process group if it is not gone in time."""
        _stop_all([started])
        self._started.remove(started)

    def close(self) -> None:
        """Kill every process, then remove the namespaces and links; raises if any remain."""
        _stop_all(self._started)
        self._started.clear()
        problems: list[str] = []
        for namespace in reversed(self._namespaces):
            problems += _kill_namespace_processes(namespace)
            if _exists_namespace(namespace):
                problems += _try_ip("netns", "del", namespace)
        self._namespaces.clear()
        # A veth pair goes with its namespace, but the kernel removes a namespace in the
        # background: give the pairs a moment to go by themselves before deleting any.
        deadline = time.monotonic() + STOP_BOUND_S
        veths = [link for link in self._links if link != self.bridge]
        while any(map(_exists_link, veths)) and time.monotonic() < deadline:
            time.sleep(0.02)
        for link in reversed(self._links):
            if _exists_link(link):
                problems += _try_ip("link", "del", link, gone_is_fine=True)
        self._links.clear()
        shutil.rmtree(self.log_dir, ignore_errors=True)
        if problems:
            raise NetworkError("the test network was not fully removed: " + "; ".join(problems))


def netns_unavailable() -> str | None:
    """Why test hosts cannot be built here, or None: found by building and removing one."""
    if os.geteuid() != 0:
        return "needs root to create network namespaces, veth pairs and a bridge"
    for tool in ("ip", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    try:
        with Network() as network:
            host = network.add_host("probe")
            done = host.run("unshare", "--uts", "--", "hostname", host.hostname)
            if done.returncode != 0:
                return f"cannot give a test host its own host name: {done.stderr.strip()}"
    except (NetworkError, OSError, subprocess.SubprocessError) as exc:
        return f"cannot build test hosts with network namespaces: {exc}"
    return None


def _ip(*args: str) -> None:
    problems = _try_ip(*args)
    if problems:
        raise NetworkError(problems[0])


def _try_ip(*args: str, gone_is_fine: bool = False) -> list[str]:
    done = subprocess.run(
        ["ip", *args], capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S, check=False
    )
    if done.returncode == 0:
        return []
    if gone_is_fine and "Cannot find device" in done.stderr:
        return []
    return [f"ip {' '.join(args)}: {done.stderr.strip() or f'exit {done.returncode}'}"]


def _disable_ipv6_on(link: str) -> None:
    knob = Path("/proc/sys/net/ipv6/conf") / link / "disable_ipv6"
    if knob.exists():  # absent when the kernel has no IPv6 at all
        knob.write_text("1")


def _exists_namespace(namespace: str) -> bool:
    return Path("/run/netns", namespace).exists()


def _exists_link(link: str) -> bool:
    return Path("/sys/class/net", link).exists()


def _stop_all(started: Sequence[Started]) -> None:
    for item in started:
        if item.process.poll() is None:
            item.process.terminate()
    deadline = time.monotonic() + STOP_BOUND_S
    for item in started:
        with contextlib.suppress(subprocess.TimeoutExpired):
            item.process.wait(timeout=max(deadline - time.monotonic(), 0.1))
        if item.process.poll() is None:
            # Not reaped, so the group id is still its own: the kill cannot hit anyone else.
            os.killpg(item.process.pid, signal.SIGKILL)
            item.process.wait(timeout=30)


def _kill_namespace_processes(namespace: str) -> list[str]:
    """Whatever still runs in a namespace of the test's own (a worker's pool process, a
    sandboxed command) is killed, so that deleting the namespace leaves nothing behind."""
    try:
        inode = os.stat(Path("/run/netns", namespace)).st_ino
    except FileNotFoundError:
        return []
    deadline = time.monotonic() + STOP_BOUND_S
    while time.monotonic() < deadline:
        listed = subprocess.run(
            ["ip", "netns", "pids", namespace],
            capture_output=True,
            text=True,
            timeout=COMMAND_TIMEOUT_S,
            check=False,
        )
        pids = [int(pid) for pid in listed.stdout.split()]
        if not pids:
            return []
        for pid in pids:
            _kill_if_in(pid, inode)
        time.sleep(0.05)
    return [f"processes still running in {namespace}"]


def _kill_if_in(pid: int, namespace_inode: int) -> None:
    """SIGKILL ``pid`` if it is (still) in the namespace: the pidfd pins the process checked."""
    with contextlib.suppress(OSError):  # gone already: nothing to kill
        pidfd = os.pidfd_open(pid)
        try:
            if os.stat(f"/proc/{pid}/ns/net").st_ino == namespace_inode:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        finally:
            os.close(pidfd)
