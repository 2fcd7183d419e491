"""The OCI runtime configuration of a run's container, and of each command run in it.

The container is a box for one run: its own PID, mount, IPC, UTS and network namespaces (no
network: only loopback), and a user namespace in which the image's user is the run's own uid
(``worker.sandbox.identity``) and every other id of 0-65535 is one of a block of host ids that no
host process uses (as Docker's ``userns-remap`` does), so ``chown`` and ``tar`` work inside.
Its first process is catatonit (Debian's, bind-mounted read-only): it only waits and reaps,
so an image needs no program of its own for it. Each call is a process started in the box
(``runc exec``) as the image's user, under the call's rlimits; the box's control group limits
memory, processes and (where the run asks) CPU, and calls of a run take turns, so those limits
are each call's.
"""

from __future__ import annotations

import resource
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from worker.sandbox.call_cgroup import CPU_PERIOD_US, cpu_quota_us

#: Where the init is bind-mounted: /dev is the container's own tmpfs, so the image's files
#: stay as they are.
INIT_PATH = "/dev/toolq-init"
#: The ids a container maps: an image's files may be owned by any of them.
CONTAINER_IDS = 65536
HOSTNAME = "toolq"
#: A command's PATH when the image sets none, as Docker's.
DEFAULT_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
#: Files a process may hold open at once (at most the worker's own hard limit: the runtime
#: sets it from inside the box, where it cannot be raised).
OPEN_FILES = 65536
#: What a root user of the image may do in the box (Docker's default set; in the box's user
#: namespace, over the box's own files only). Other users get none.
ROOT_CAPABILITIES = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
]
_MASKED = [
    "/proc/acpi",
    "/proc/asound",
    "/proc/kcore",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/timer_list",
    "/proc/timer_stats",
    "/proc/sched_debug",
    "/proc/scsi",
    "/sys/firmware",
]
_READ_ONLY = ["/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"]


@dataclass(frozen=True, slots=True)
class IdMap:
    """``size`` ids from ``container_id`` in the box are ``host_id`` onwards outside it."""

    container_id: int
    host_id: int
    size: int

    def line(self) -> str:
        """As /proc/<pid>/uid_map takes it."""
        return f"{self.container_id} {self.host_id} {self.size}\n"

    def as_spec(self) -> dict[str, int]:
        return {"containerID": self.container_id, "hostID": self.host_id, "size": self.size}


def id_maps(inside: int, own: int, block: int) -> list[IdMap]:
    """The box's mapping for one kind of id: ``inside`` (the image user's) is the run's own
    ``own``; every other id of 0-65535 is ``block`` plus that id."""
    maps = []
    if inside > 0:
        maps.append(IdMap(0, block, inside))
    maps.append(IdMap(inside, own, 1))
    if inside + 1 < CONTAINER_IDS:
        maps.append(IdMap(inside + 1, block + inside + 1, CONTAINER_IDS - inside - 1))
    return maps


@dataclass(frozen=True, slots=True)
class BoxSpec:
    """What makes one run's box."""

    init_source: str
    workspace: str
    #: Where the workspace is seen in the box: the image's WorkingDir, or /workspace.
    workdir: str
    uids: Sequence[IdMap]
    gids: Sequence[IdMap]
    user: tuple[int, int]
    env: Sequence[str]
    cgroups_path: str
    memory_bytes: int
    swap_accounted: bool
    #: None: no process limit in the host's group (gVisor's own threads live there).
    max_processes: int | None
    #: The CPUs the box's processes may use together; None: no limit.
    cpu: float | None
    #: Files of the bundle bind-mounted read-only: /etc/hosts and /etc/hostname.
    etc_files: Mapping[str, str]


def container_config(box: BoxSpec) -> dict[str, Any]:
    """The bundle's config.json."""
    uid, gid = box.user
    memory: dict[str, int] = {"limit": box.memory_bytes}
    if box.swap_accounted:
        memory["swap"] = box.memory_bytes  # memory and swap together: no swapping past it
    return {
        "ociVersion": "1.0.2",
        "process": {
            "terminal": False,
            "user": {"uid": uid, "gid": gid},
            "args": [INIT_PATH, "-P"],
            "env": list(box.env),
            "cwd": "/",
            "capabilities": _capabilities([]),
            "rlimits": [_open_files()],
            "noNewPrivileges": True,
        },
        "root": {"path": "rootfs", "readonly": False},
        "hostname": HOSTNAME,
        "mounts": _mounts(box),
        "linux": {
            "namespaces": [
                {"type": kind}
                for kind in ("pid", "ipc", "uts", "mount", "network", "user", "cgroup")
            ],
            "uidMappings": [m.as_spec() for m in box.uids],
            "gidMappings": [m.as_spec() for m in box.gids],
            "cgroupsPath": box.cgroups_path,
            "resources": {
                "memory": memory,
                # The init is one of them.
                **({} if box.max_processes is None else {"pids": {"limit": box.max_processes + 1}}),
                **(
                    {}
                    if box.cpu is None
                    else {"cpu": {"quota": cpu_quota_us(box.cpu), "period": CPU_PERIOD_US}}
                ),
            },
            "maskedPaths": _MASKED,
            "readonlyPaths": _READ_ONLY,
        },
    }


def process_config(
    argv: Sequence[str],
    *,
    user: tuple[int, int],
    cwd: str,
    env: Sequence[str],
    file_size_mb: int,
    cpu_s: int | None = None,
) -> dict[str, Any]:
    """A call's process, as ``runc exec --process`` takes it: files it writes are at most
    ``file_size_mb``, and it may use ``cpu_s`` seconds of CPU (a second more past its warning)."""
    uid, gid = user
    file_size = _rlimit("RLIMIT_FSIZE", file_size_mb << 20, file_size_mb << 20)
    cpu = [] if cpu_s is None else [_rlimit("RLIMIT_CPU", cpu_s, cpu_s + 1)]
    return {
        "terminal": False,
        "user": {"uid": uid, "gid": gid},
        "args": list(argv),
        "env": list(env),
        "cwd": cwd,
        "capabilities": _capabilities(ROOT_CAPABILITIES if uid == 0 else []),
        "rlimits": [_open_files(), *cpu, file_size],
        "noNewPrivileges": True,
    }


def merged_env(image_env: Sequence[str], *overrides: Mapping[str, str]) -> list[str]:
    """The image's variables, with PATH where it sets none, then each of ``overrides``."""
    merged: dict[str, str] = {"PATH": DEFAULT_PATH}
    for entry in image_env:
        name, sep, value = entry.partition("=")
        if sep and name:
            merged[name] = value
    for extra in overrides:
        merged.update(extra)
    return [f"{name}={value}" for name, value in merged.items()]


def _mounts(box: BoxSpec) -> list[dict[str, Any]]:
    mounts: list[dict[str, Any]] = [
        {"destination": "/proc", "type": "proc", "source": "proc"},
        {
            "destination": "/dev",
            "type": "tmpfs",
            "source": "tmpfs",
            "options": ["nosuid", "strictatime", "mode=755", "size=65536k"],
        },
        {
            "destination": "/dev/pts",
            "type": "devpts",
            "source": "devpts",
            "options": ["nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"],
        },
        {
            "destination": "/dev/shm",
            "type": "tmpfs",
            "source": "shm",
            "options": ["nosuid", "noexec", "nodev", "mode=1777", "size=65536k"],
        },
        {
            "destination": "/dev/mqueue",
            "type": "mqueue",
            "source": "mqueue",
            "options": ["nosuid", "noexec", "nodev"],
        },
        {
            "destination": "/sys",
            "type": "sysfs",
            "source": "sysfs",
            "options": ["nosuid", "noexec", "nodev", "ro"],
        },
        _bind(box.init_source, INIT_PATH, read_only=True),
        _bind(box.workspace, box.workdir, read_only=False),
    ]
    for destination, source in box.etc_files.items():
        mounts.append(_bind(source, destination, read_only=True))
    return mounts


def _bind(source: str, destination: str, *, read_only: bool) -> dict[str, Any]:
    return {
        "destination": destination,
        "type": "bind",
        "source": source,
        "options": ["rbind", "ro" if read_only else "rw", "nosuid", "nodev"],
    }


def _capabilities(names: list[str]) -> dict[str, list[str]]:
    return {kind: list(names) for kind in ("bounding", "effective", "permitted")}


def _open_files() -> dict[str, Any]:
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    limit = OPEN_FILES if hard == resource.RLIM_INFINITY else min(OPEN_FILES, hard)
    return _rlimit("RLIMIT_NOFILE", limit, limit)


def _rlimit(name: str, soft: int, hard: int) -> dict[str, Any]:
    return {"type": name, "soft": soft, "hard": hard}
