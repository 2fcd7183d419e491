"""A container per run, alive for the run: started by its first command, ended with the run.

```
<cache>/boxes/<name>/record.json   what the box is (``BoxRecord``): run, image, owner, user
<cache>/boxes/<name>/config.json   its OCI configuration; rootfs, upper, work: its files
<cache>/boxes/<name>.lock          held while the box starts, runs a call, or ends
```

A box is named after its run, so any process of the worker finds it. Its record names the
worker that holds it (``worker.images.owner``): a box whose worker died, or whose run's
workspace was removed, is ended by the next sweep on the host (``sweep``).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import time
from collections.abc import Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel

from worker.contract.errors import EnvironmentLost, ImageError
from worker.contract.image_reference import parse_reference
from worker.contract.image_sources import ImageSources
from worker.contract.run_limits import RunLimits
from worker.contract.sandbox_settings import SandboxSettings
from worker.egress.netns import bring_loopback_up, in_network_of
from worker.exceptions import MountError, RuntimeFailed
from worker.images.cache import DEFAULT_TAG_TTL_S, CachedImage, ImageCache
from worker.images.fetch import Tools
from worker.images.group import BoxGroup, swap_accounted
from worker.images.inside import (
    DEFAULT_WORKDIR,
    box_user,
    box_workdir,
    init_binary,
    protect_from_oom,
)
from worker.images.locks import held_lock
from worker.images.mounts import host_id, image_view, mount_rootfs, remove_bundle
from worker.images.owner import Owner, current_owner
from worker.images.rootfs import resolve_in_root
from worker.images.runtime import OciRuntime
from worker.images.seed import seed_workspace
from worker.images.sources import check_source
from worker.images.spec import BoxSpec, container_config, id_maps, merged_env
from worker.plumbing.proc_stat import process_alive

_LOCK_POLL_S = 0.02
#: What gVisor's own kernel takes in the host's group of its box, over the run's memory limit.
GVISOR_MEMORY_MB = 256


class BoxRecord(BaseModel):
    """One run's box, as every process of its worker reads it."""

    name: str
    run_id: str
    image: str
    digest: str
    runtime: str
    owner: Owner
    workspace: str
    #: The workspace's device and inode at start: a workspace removed and made again is
    #: another folder, which the box does not see.
    workspace_id: tuple[int, int]
    workdir: str
    #: Who runs in the box (its ids inside), and that user's variables.
    user: tuple[int, int]
    env: list[str]
    cgroups_path: str
    #: The host pid of the box's first process (runc), or of its sandbox (runsc).
    init_pid: int
    start_ms: int
    pulled: bool
    #: The limits its group holds (the run's own where it asked, else the worker's); pids
    #: null under gVisor, whose own threads share the group. None: a box of an older worker.
    limits: RunLimits | None = None


@dataclass(frozen=True, slots=True)
class BoxSettings:
    """How boxes are made on this worker (from ``WorkerSettings`` and the sandbox's)."""

    cache_root: Path
    cache_bytes: int
    runtime: str
    tools: Tools
    #: The sandbox's settings (``TOOLQ_SANDBOX_*``): a box's limits and where its group is.
    sandbox: SandboxSettings
    #: The first of the 65,536 host ids that stand for a box's ids other than its user's.
    id_block: int
    #: Where images may come from (``TOOLQ_IMAGE_SOURCES``); empty: anywhere.
    sources: ImageSources = field(default_factory=ImageSources)
    #: How long a tag's digest is believed without asking its registry.
    tag_ttl_s: float = DEFAULT_TAG_TTL_S


class Boxes:
    """The boxes of this host's cache, and the image cache they start from."""

    def __init__(self, settings: BoxSettings) -> None:
        self.settings = settings
        self.folder = settings.cache_root / "boxes"
        self.cache = ImageCache(
            settings.cache_root,
            settings.cache_bytes,
            settings.tools,
            self.digests_in_use,
            settings.tag_ttl_s,
        )

    def runtime(self, image: str) -> OciRuntime:
        try:
            return OciRuntime.find(self.settings.runtime, self.settings.cache_root)
        except RuntimeFailed as exc:
            raise ImageError(image, str(exc)) from None

    def start(
        self,
        run_id: str,
        workspace: Path,
        host_ids: tuple[int, int],
        image: str,
        deadline: float,
        *,
        user: str | None = None,
        env: Mapping[str, str] | None = None,
        limits: RunLimits | None = None,
    ) -> BoxRecord:
        """The run's box from ``image``, started now, or the one it has when it is from the
        same image, under the same limits (``limits``: the run's own, within the worker's
        defaults where it names none), and alive. ``ImageError`` (one line) when it cannot be
        had."""
        ref = parse_reference(image)
        check_source(ref, self.settings.sources)
        runtime = self.runtime(image)
        name = self.name_of(run_id)
        started = time.monotonic()
        with self.turn(name, deadline, image):
            held = self._held(limits, runtime)
            existing = self.find(run_id)
            if existing is not None:
                same = existing.image == image and existing.limits == held
                if same and self._healthy(existing, runtime) is None:
                    return existing
                self._end(existing, runtime)
            digest = self.cache.tags.resolve(ref, deadline)
            bundle = self.folder / name

            def claim(cached: CachedImage) -> None:
                # Written under the cache's lock: from now on the image is in use.
                shutil.rmtree(bundle, ignore_errors=True)
                bundle.mkdir(parents=True, mode=0o700)
                (bundle / "claim.json").write_text(json.dumps({"digest": digest}))

            cached, pulled = self.cache.acquire(ref, digest, deadline, claim)
            try:
                return self._make(
                    name, run_id, image, cached, runtime, workspace, host_ids, user, env,
                    deadline, pulled, started, held,
                )  # fmt: skip
            except BaseException:
                self._remove(name, runtime)
                raise

    def name_of(self, run_id: str) -> str:
        """The name of ``run_id``'s box here: this worker's fleet's, in this cache."""
        return box_name(run_id, self.settings.cache_root, current_owner().fleet)

    def find(self, run_id: str) -> BoxRecord | None:
        return self._read(self.folder / self.name_of(run_id))

    def check(self, record: BoxRecord) -> None:
        """``EnvironmentLost`` unless ``record``'s box can take a call here and now."""
        why = self._healthy(record, None)
        if why is not None:
            raise EnvironmentLost(why)

    def end(self, run_id: str, deadline: float) -> BoxRecord | None:
        """End the run's box, if it has one here; what it was."""
        record = self.find(run_id)
        if record is None:
            return None
        with self.turn(record.name, deadline, record.image):
            self._end(record, self.runtime(record.image), at_once=True)
        return record

    def digests_in_use(self) -> set[str]:
        """The images boxes of this host use (or are being started from)."""
        found = set()
        for entry in self.folder.iterdir() if self.folder.is_dir() else []:
            for name in ("record.json", "claim.json"):
                with contextlib.suppress(OSError, ValueError, KeyError):
                    found.add(str(json.loads((entry / name).read_text())["digest"]))
        return found

    def records(self) -> list[BoxRecord]:
        if not self.folder.is_dir():
            return []
        return [r for e in self.folder.iterdir() if (r := self._read(e)) is not None]

    def turn(self, name: str, deadline: float, image: str) -> AbstractContextManager[None]:
        """The box's lock: a call, a start or an end at a time."""
        if not self.folder.is_dir():
            self._make_folder(image)
        busy = "the run's container was busy with another command until this one's time ran out"
        return held_lock(self.folder / f"{name}.lock", deadline, _LOCK_POLL_S, image, busy)

    def _make_folder(self, image: str) -> None:
        """The boxes' folder. A box's runtime reaches its bundle as the box's own root, an
        unprivileged uid: it must be let through every folder above (never list them); each
        bundle is then that user's alone."""
        self.folder.mkdir(parents=True, exist_ok=True)
        for folder in (self.settings.cache_root, self.folder):
            os.chmod(folder, 0o711)  # noqa: S103
        for folder in self.settings.cache_root.resolve().parents:
            if not os.stat(folder).st_mode & 0o001:
                raise ImageError(
                    image,
                    f"containers cannot reach TOOLQ_IMAGE_CACHE={self.settings.cache_root}: "
                    f"{folder} lets no other user through (chmod o+x {folder}, or choose "
                    "another folder)",
                )

    def _make(
        self,
        name: str,
        run_id: str,
        image: str,
        cached: CachedImage,
        runtime: OciRuntime,
        workspace: Path,
        host_ids: tuple[int, int],
        user: str | None,
        env: Mapping[str, str] | None,
        deadline: float,
        pulled: bool,
        started: float,
        limits: RunLimits,
    ) -> BoxRecord:
        settings = self.settings
        assert limits.memory_mb is not None
        bundle = self.folder / name
        info = os.stat(workspace)
        workdir = box_workdir(cached.record.workdir)
        try:
            with image_view(cached.layer_roots, bundle / "view") as view:
                inside = box_user(image, cached, view, runtime, user)
                if workdir != DEFAULT_WORKDIR:
                    # The workspace is mounted over the image's WorkingDir: what the image has
                    # there comes into the workspace first, as into a new Docker volume.
                    seed_workspace(resolve_in_root(view, workdir), workspace, host_ids)
            uids = id_maps(inside[0], host_ids[0], settings.id_block)
            gids = id_maps(inside[1], host_ids[1], settings.id_block)
            os.chown(bundle, host_id(uids, 0), host_id(gids, 0))
            mount_rootfs(cached.layer_roots, bundle, uids, gids)
        except MountError as exc:
            raise ImageError(image, f"its root file system could not be mounted: {exc}") from None
        (bundle / "hosts").write_text(f"127.0.0.1\tlocalhost {name[:63]}\n::1\tlocalhost\n")
        hostname = bundle / "hostname"
        hostname.write_text("toolq\n")
        box_env = merged_env(cached.record.env, env or {})
        cgroups_path = group_path(name)
        spec = BoxSpec(
            init_source=init_binary(image),
            workspace=str(workspace),
            workdir=workdir,
            uids=uids,
            gids=gids,
            user=inside,
            env=box_env,
            cgroups_path=cgroups_path,
            memory_bytes=(limits.memory_mb + (GVISOR_MEMORY_MB if runtime.gvisor else 0)) << 20,
            swap_accounted=swap_accounted(settings.sandbox.cgroup_root),
            max_processes=limits.pids,
            cpu=limits.cpu,
            etc_files={"/etc/hosts": str(bundle / "hosts"), "/etc/hostname": str(hostname)},
        )
        (bundle / "config.json").write_text(json.dumps(container_config(spec)))
        pid_file = bundle / "init.pid"
        try:
            runtime.create(name, bundle, pid_file, deadline)
            init_pid = int(pid_file.read_text().strip())
            protect_from_oom(init_pid)
            if not runtime.gvisor:
                # A box has no network, but ``localhost`` works in it, as in Docker's
                # ``--network none`` (runsc's own network stack brings it up itself).
                in_network_of(init_pid, bring_loopback_up)
            runtime.start(name, deadline)
        except (RuntimeFailed, OSError, ValueError) as exc:
            raise ImageError(image, f"its container could not start: {exc}") from None
        record = BoxRecord(
            name=name,
            run_id=run_id,
            image=image,
            digest=cached.record.digest,
            runtime=runtime.name,
            owner=current_owner(),
            workspace=str(workspace),
            workspace_id=(info.st_dev, info.st_ino),
            workdir=workdir,
            user=inside,
            env=box_env,
            cgroups_path=cgroups_path,
            init_pid=init_pid,
            start_ms=round((time.monotonic() - started) * 1000),
            pulled=pulled,
            limits=limits,
        )
        (bundle / "record.json").write_text(record.model_dump_json())
        (bundle / "claim.json").unlink(missing_ok=True)
        return record

    def _held(self, limits: RunLimits | None, runtime: OciRuntime) -> RunLimits:
        """The memory, process and CPU limits a box of a run asking ``limits`` gets here."""
        sandbox = self.settings.sandbox.limited(limits)
        return RunLimits(
            memory_mb=sandbox.memory_mb,
            pids=None if runtime.gvisor else sandbox.max_processes,
            cpu=sandbox.cpu,
        )

    def _healthy(self, record: BoxRecord, runtime: OciRuntime | None) -> str | None:
        """Why ``record``'s box cannot take calls from this worker, or None when it can."""
        here = current_owner()
        what = f"the container of run {record.run_id} (image {record.image!r})"
        if record.owner.worker != here.worker or record.owner.pid != here.pid:
            return f"{what} belongs to worker {record.owner.worker}, not to this one"
        try:
            info = os.stat(record.workspace)
        except OSError:
            return f"{what} was ended: the run's workspace was removed"
        if (info.st_dev, info.st_ino) != tuple(record.workspace_id):
            return f"{what} was ended: the run's workspace was removed and made again"
        if not process_alive(record.init_pid):
            return f"{what} stopped (its first process is gone)"
        if runtime is not None and not runtime.running(record.name):
            return f"{what} is not running"
        return None

    def _end(self, record: BoxRecord, runtime: OciRuntime, *, at_once: bool = False) -> None:
        """End ``record``'s box; ``at_once`` where its run is over (``OciRuntime.end_now``)."""
        if record.runtime != runtime.name:
            # Made by another runtime than the one set now: that one ends it.
            with contextlib.suppress(RuntimeFailed):
                runtime = OciRuntime.find(record.runtime, self.settings.cache_root)
        self._remove(record.name, runtime, record.init_pid if at_once else None)

    def _remove(self, name: str, runtime: OciRuntime, sandbox_pid: int | None = None) -> None:
        with contextlib.suppress(RuntimeFailed):
            if sandbox_pid is None:
                runtime.delete(name)
            else:
                runtime.end_now(name, sandbox_pid)
        remove_bundle(self.folder / name)
        BoxGroup(self.settings.sandbox.cgroup_root, group_path(name)).remove()

    @staticmethod
    def _read(folder: Path) -> BoxRecord | None:
        try:
            return BoxRecord.model_validate_json((folder / "record.json").read_bytes())
        except (OSError, ValueError):
            return None


def box_name(run_id: str, cache_root: Path, fleet: str) -> str:
    """A container name for ``run_id``, in the characters runtimes take: of its fleet and cache
    too, since the name is also its control group's (``group_path``), one for the whole host,
    and two fleets on a host may each have a run of the same id."""
    key = "\0".join((fleet, str(cache_root), run_id))
    return "toolq-" + hashlib.sha256(key.encode()).hexdigest()[:24]


def group_path(name: str) -> str:
    """The box's control group, in every hierarchy (the runtime's ``cgroupsPath``)."""
    return f"/toolq-images/{name}"


def box_group(settings: BoxSettings, record: BoxRecord) -> BoxGroup:
    return BoxGroup(settings.sandbox.cgroup_root, record.cgroups_path)
