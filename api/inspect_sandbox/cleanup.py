"""``inspect sandbox cleanup toolq [RUN_ID]``: the workspaces that evals killed outright left.

Each sample's workspace is removed as the sample ends; an eval killed outright (SIGKILL, a lost
machine) leaves those of its samples then running. They are the runs ``inspect-*`` whose owner
(``api.inspect_sandbox.owners``) no longer runs, and this removes them, through the queue like
any removal: never one with a call of its run in flight (it is said to be kept). Given a run
id, it removes that one workspace, whether its eval runs or not, as Inspect's Docker sandbox
removes the one environment it is given.
"""

from __future__ import annotations

import asyncio
import contextlib
from dataclasses import dataclass, field

from api.exceptions import FileProblemError, ServiceCallError
from api.inspect_sandbox.link import FleetLink
from api.inspect_sandbox.owners import RUN_PREFIX, live_owners, new_run_id, owner_of
from api.runs.workspace import RunWorkspace


@dataclass
class Cleaned:
    """What a cleanup removed, and what it kept and why."""

    removed: list[str] = field(default_factory=list)
    kept: dict[str, str] = field(default_factory=dict)
    #: Run ids asked for that have no workspace on the fleet.
    absent: list[str] = field(default_factory=list)

    def report(self) -> str:
        lines = [f"removed {run}" for run in self.removed]
        lines += [f"kept {run}: {why}" for run, why in self.kept.items()]
        lines += [f"no workspace of {run} on the fleet" for run in self.absent]
        count = f"{len(self.removed)} workspace(s)" if self.removed else "no workspace"
        lines.append(f"toolq: removed {count} of toolq sandboxes whose eval no longer runs")
        return "\n".join(lines)


async def clean_up(link: FleetLink, run_id: str | None) -> Cleaned:
    """Remove the workspace of ``run_id``, or else those of every eval that no longer runs, on
    the fleet ``link`` has open."""
    if run_id is not None and not run_id.startswith(RUN_PREFIX):
        raise ValueError(
            f"{run_id!r} is not the run id of a toolq sandbox: those are "
            f"{RUN_PREFIX}<task>-<eval>-<sample>, as each sample's transcript shows"
        )
    dispatcher = await link.dispatcher()
    # The listing is a call of a run of its own, whose workspace goes last.
    asking = RunWorkspace(dispatcher, link.fleet, new_run_id("cleanup", link.owner))
    cleaned = Cleaned()
    try:
        if run_id is not None:
            if run_id in await asking.runs_beside(run_id):
                await _remove(RunWorkspace(dispatcher, link.fleet, run_id), cleaned)
            else:
                cleaned.absent.append(run_id)
            return cleaned
        tried: set[str] = set()
        while True:
            listed = await asking.runs_beside(RUN_PREFIX)
            live = await asyncio.to_thread(live_owners, link.settings.redis_url)
            ownerless = [run for run in listed if run not in tried and owner_of(run) not in live]
            if not ownerless:  # a listing holds 10,000 at most: ask again until none is left
                return cleaned
            tried.update(ownerless)
            for run in ownerless:
                await _remove(RunWorkspace(dispatcher, link.fleet, run), cleaned)
    finally:
        # Its own workspace, empty: else left to the workers, which remove idle workspaces.
        with contextlib.suppress(ServiceCallError, FileProblemError):
            await asking.remove()


async def _remove(workspace: RunWorkspace, cleaned: Cleaned) -> None:
    try:
        await workspace.remove()
    except FileProblemError as exc:
        in_use = exc.kind == "in_use"
        cleaned.kept[workspace.run_id] = "a call of the run is in flight" if in_use else str(exc)
    except ServiceCallError as exc:
        cleaned.kept[workspace.run_id] = f"the fleet did not remove it: {exc}"
    else:
        cleaned.removed.append(workspace.run_id)
