"""What each way of starting a command buys: ``run_sandboxed 'true'`` in process, as the sandbox
pool's root workers run it (a uid per run, private folders, namespaces, control groups), with one
start-up path of ``worker.sandbox.start`` taken away at a time.

- as the pool runs: the spawner's launches, made ahead, for the call's run where one is ready;
- no launch for one run: launches made ahead for any run only (each call binds and drops);
- no launch made ahead: each call makes its own launch on its path (``launch.made_now``);
- launches by programs (bash init): the spawner's system calls replaced by the programs a
  worker that is not root starts (a shell joins the groups, setpriv, unshare, a bash init);
- launches by programs (dash init): the same with a dash init, which cannot fork ahead;
- no control group: ``TOOLQ_SANDBOX_CGROUP=off``, a plain ``subprocess.Popen`` per call.

Calls go back to back, and after a pause (as an agent's next command follows a model turn): the
pause lets the pool's thread make the next launches before the call. Each path runs in blocks,
the blocks in turns, so that other load weighs on all alike. ``python -m bench.start_paths``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path

from bench.stats import percentile
from worker.contract.sandbox_settings import SandboxSettings
from worker.contract.settings import WorkerSettings
from worker.sandbox import SHELL, SandboxConfig, SandboxError, command, run_sandboxed
from worker.sandbox.layers import plan_for
from worker.sandbox.plan import Plan
from worker.sandbox.start import ready_pool
from worker.tools.factory import prepare_workspace

POOL = "as the pool runs (spawner, made ahead, for the run)"
ANY_RUN = "no launch for one run (made ahead for any run)"
MADE_NOW = "no launch made ahead (made on the call's path)"
BASH = "launches by programs, bash init"
DASH = "launches by programs, dash init"
NO_GROUP = "no control group (a plain Popen per call)"
PAUSE_S = 0.05


def _by_programs(bash: bool) -> Callable[[SandboxConfig, int], Plan]:
    """``plan_for`` as on a root worker without the spawner, with a bash or a dash init."""

    def plan(config: SandboxConfig, euid: int) -> Plan:
        made = plan_for(config, euid)
        shell = (shutil.which("bash") or SHELL) if bash else SHELL
        return dataclasses.replace(made, spawned=False, init_shell=shell)

    return plan


@contextlib.contextmanager
def _path(name: str) -> Iterator[None]:
    """The sandbox without the start-up path that ``name`` takes away."""
    with ExitStack() as undo:
        if name == ANY_RUN:
            undo.enter_context(_set(Plan, "for_run", lambda self, *args: None))
        elif name == MADE_NOW:
            undo.enter_context(_set(ready_pool, "READY", 0))
            undo.enter_context(_set(ready_pool, "EACH_RUN", 0))
        elif name in (BASH, DASH):
            undo.enter_context(_set(command, "plan_for", _by_programs(name == BASH)))
        try:
            yield
        finally:
            ready_pool.launcher.release()


@contextlib.contextmanager
def _set(owner: object, attribute: str, value: object) -> Iterator[None]:
    before = getattr(owner, attribute)
    setattr(owner, attribute, value)
    try:
        yield
    finally:
        setattr(owner, attribute, before)


def _call(folder: Path, owner: tuple[int, int] | None, config: SandboxConfig) -> float:
    started = time.perf_counter()
    result = run_sandboxed(
        "true", cwd=folder, home=folder, env={}, timeout_ms=10_000, config=config, identity=owner
    )
    if result.exit_code != 0:
        raise SandboxError(f"'true' failed: {result.stderr}")
    return (time.perf_counter() - started) * 1000


def measure(calls: int, turns: int) -> dict[str, dict[str, float]]:
    """p50 ms of each path, back to back and after a pause."""
    root = Path(tempfile.mkdtemp(prefix="toolq-bench-start-"))
    root.chmod(0o755)
    samples: dict[tuple[str, bool], list[float]] = {}
    try:
        configs = {
            name: SandboxConfig.from_settings(
                WorkerSettings(
                    workspace_root=root,
                    sandbox=SandboxSettings(cgroup="off" if name == NO_GROUP else "auto"),
                )
            )
            for name in (POOL, ANY_RUN, MADE_NOW, BASH, DASH, NO_GROUP)
        }
        workspace = prepare_workspace(root / "bench-start", configs[POOL])
        folder, owner = workspace.root, workspace.owner
        for _ in range(turns):
            for name, config in configs.items():
                with _path(name):
                    for paused in (False, True):
                        for index in range(calls + 5):
                            if paused:
                                time.sleep(PAUSE_S)
                            took = _call(folder, owner, config)
                            if index >= 5:  # the first calls make the path's first launches
                                samples.setdefault((name, paused), []).append(took)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    found: dict[str, dict[str, float]] = {}
    for (name, paused), values in samples.items():
        found.setdefault(name, {})["paused" if paused else "back to back"] = percentile(values, 50)
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=60, help="calls per block")
    parser.add_argument("--turns", type=int, default=3, help="blocks of each path")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench.start_paths: needs root, as the sandbox pool's workers run")
    found = measure(args.calls, args.turns)
    print(f"run_sandboxed 'true' p50 ms, {args.calls * args.turns} calls each")
    print(f"| path | back to back | after a pause of {PAUSE_S * 1000:.0f} ms |")
    print("|---|---:|---:|")
    for name, p50 in found.items():
        print(f"| {name} | {p50['back to back']:.2f} | {p50['paused']:.2f} |")


if __name__ == "__main__":
    main()
