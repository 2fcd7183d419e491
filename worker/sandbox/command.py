"""Running one command from start to end: started under the plan (inside its control groups,
where it has them), its output pumped until it exits or its time is up, then everything it
started killed, its result and usage told, and its group removed."""

from __future__ import annotations

import contextlib
import os
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import NotRequired, TypedDict, Unpack

from worker.contract.network import NetworkPolicy
from worker.egress import Egress, NoNetworkNamespace, open_egress
from worker.exceptions import SandboxError
from worker.sandbox.config import COMMAND_ENV, INPUT_FOLDER, SHELL, SandboxConfig
from worker.sandbox.ending import Ending
from worker.sandbox.host_registry import HostRegistry
from worker.sandbox.layers import plan_for
from worker.sandbox.names import BOUND
from worker.sandbox.output import CappedStream, Notice, Pump
from worker.sandbox.plan import Plan, private_binds
from worker.sandbox.result import SandboxResult, build_result
from worker.sandbox.start.launch import (
    CONFIRM_BOUND_S,
    Launch,
    dies_first,
    made_now,
    session_keyring,
    still_bound,
)
from worker.sandbox.start.ready_pool import launcher
from worker.sandbox.start.spawner_client import LaunchedProcess
from worker.sandbox.uid_leftovers import run_guard
from worker.sandbox.uid_reset import hand_over, holder_of
from worker.sandbox.volumes import detached_copy

#: How long to keep reading once the command has ended and its leftovers were killed: their
#: pipes close at once, unless something escaped (possible only without a PID namespace).
DRAIN_BOUND_S = 0.5


class CommandCall(TypedDict):
    """How one command runs, beside the command itself: ``run_sandboxed``'s keywords, which
    ``worker.tools.commands.run_command`` takes too and hands on as they are."""

    #: The folder the command starts in.
    cwd: Path
    #: The run's workspace: the command's HOME, and what a call with private folders binds.
    home: Path
    #: The caller's variables, over the command's own minimal environment.
    env: Mapping[str, str]
    timeout_ms: int
    config: SandboxConfig
    #: The command's standard input; none by default.
    stdin: NotRequired[bytes | None]
    #: Called once all is ready, just before the command is handed over: what it raises stops
    #: the call with nothing of the command started.
    before_start: NotRequired[Callable[[], None] | None]
    #: The uid and gid of the command's run (its workspace's owner), which a root worker with
    #: per-run uids needs.
    identity: NotRequired[tuple[int, int] | None]
    #: The run's network (``worker.egress``); None or ``"none"``: loopback alone.
    network: NotRequired[NetworkPolicy | None]


def run_sandboxed(command: str | Sequence[str], **call: Unpack[CommandCall]) -> SandboxResult:
    """Run ``command`` in ``cwd`` (a string through ``/bin/sh -c``, a sequence as the argv),
    with ``stdin`` as its input, kill everything it started, report the outcome."""
    config, home = call["config"], call["home"]
    plan = plan_for(config, os.geteuid()).for_folder(str(call["cwd"]))
    call_plan = plan.for_identity(call.get("identity"))
    if plan.per_run and call_plan.drop_to is not None:
        # Before any process of the uid, this one's or a launch made ahead for its run.
        try:
            config.note_uid_used(home, call_plan.drop_to[0])
        except OSError as exc:
            raise SandboxError(f"the run's uid could not be noted as used: {exc}") from exc
        # The uid's first call for this run on this host: nothing of an earlier run is left.
        hand_over(config.host_state, call_plan.drop_to[0], holder_of(home))
    with _input_file(call.get("stdin"), call_plan.drop_to) as input_path:
        if input_path is not None:
            # The command's own shell opens its input, as the user it runs as, whatever the
            # layers before it gave it as standard input.
            command = [SHELL, "-c", 'exec "$@" <"$0"', input_path, *_as_argv(command)]
        # What a call with private folders binds: the run's /tmp, its workspace, its input's.
        # In the mount namespace that only hides processes: the files naming the run's uid.
        keep: tuple[tuple[str, str], ...] = ()
        if plan.per_run and call_plan.drop_to is not None and (plan.namespaced or plan.hide_argv):
            keep = config.run_names_for(home, *call_plan.drop_to)
        if plan.per_run and plan.namespaced and call_plan.drop_to is not None:
            run_tmp = config.run_tmp_for(home, call_plan.drop_to[1])
            inputs = os.path.dirname(input_path) if input_path else None
            keep = private_binds(str(home), run_tmp, inputs, keep)
        with run_guard(call_plan, config):
            return _run(plan, call_plan, keep, command, call)


def _run(
    plan: Plan,
    call_plan: Plan,
    keep: tuple[tuple[str, str], ...],
    command: str | Sequence[str],
    call: CommandCall,
) -> SandboxResult:
    cwd, home, config, timeout_ms = call["cwd"], call["home"], call["config"], call["timeout_ms"]
    before_start = call.get("before_start") or (lambda: None)
    # The marker names the worker process too (its id in the host's registry, not a pid, which
    # means nothing in another PID namespace), so a later sweep can tell an orphan (its worker
    # was killed mid-call) from a command still running for a live worker.
    marker = "" if plan.sweep_uid is None else f"{_worker_id(config)}-{uuid.uuid4().hex}"
    base_env = {**COMMAND_ENV, "HOME": str(home), "PWD": str(cwd)}
    argv, process_env = call_plan.command_line(
        command, base_env, call["env"], marker, timeout_ms, config, keep
    )
    network = call.get("network")
    wants_network = network is not None and not network.is_none
    if not plan.grouped:
        if wants_network:
            raise SandboxError(
                "this worker runs commands without a launch of their own, so it cannot give "
                'them a network; ask for network "none"'
            )
        before_start()
        started = time.monotonic()
        try:
            with session_keyring(plan):
                proc = subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    cwd=cwd,
                    env=process_env,
                    start_new_session=True,  # also detaches from any terminal: no TIOCSTI tricks
                    umask=0o077 if plan.per_run else -1,  # /tmp is shared: the run's own files
                )
            # Before the command, which comes a few programs later; once those dropped to the
            # run's uid, a worker without privilege over it cannot: a run's private-folder
            # script, which is root, sets it again itself.
            dies_first(proc.pid)
        except OSError as exc:
            raise SandboxError(f"the command could not be started: {exc.strerror or exc}") from exc
        alone = Ending(proc, call_plan, marker, None, None)
        return _follow(proc, alone, started, timeout_ms, config)
    # A launch made for this run alone, if one is ready: its folders bound, its shell waiting
    # as the run's uid. Else one made for any run, which binds and drops as the call comes.
    run_tmp = next((source for source, target in keep if target == "/tmp"), None)
    names = tuple(pair for pair in keep if pair[1] in BOUND) if plan.namespaced else ()
    for_run = plan.for_run(call_plan.drop_to, str(home), run_tmp, names)
    if for_run is not None:
        # Its launches bind the folder of the calls' inputs, which must be there before they
        # are made, though no call here had input yet: else each dies as it starts.
        _input_folder()
    chosen = for_run if for_run is not None and launcher.ready(for_run, config) else plan
    ready = launcher.take(chosen, config)
    if not still_bound(ready):
        ready.abandon()
        chosen, ready = plan, launcher.take(plan, config)
    if for_run is not None:
        # Made while this call runs, at the lowest priority: the run's next call finds it.
        launcher.prepare_for_run(for_run, config)
    ending: Ending | None = None
    egress: Egress | None = None
    try:
        before_start()
        started = time.monotonic()
        drop = call_plan.drop_to if plan.per_run else None
        limits = plan.limits(timeout_ms, config)

        def hand_over(taken: Launch, made_for: Plan) -> None:
            nonlocal egress
            env = process_env
            if network is not None and wants_network:
                if egress is not None:  # made for a launch that died
                    egress.close()
                egress = _egress_for(taken, network)
                env = {**process_env, **egress.env}
            bind = () if made_for.keep else keep
            attach = _volume_of(made_for, config, home)
            try:
                taken.start(argv, cwd, env, limits, drop=drop, bind=bind, attach=attach)
            finally:
                if attach is not None:
                    os.close(attach[0])

        try:
            hand_over(ready, chosen)
        except OSError:
            # The launch died while it waited (its socket's other end is closed): nothing read
            # the call's line whole, so nothing of the command started; a launch made now runs it.
            ready.abandon()
            chosen, ready = plan, made_now(plan, config)
            try:
                hand_over(ready, chosen)
            except OSError as exc:
                raise SandboxError(f"the command could not be started: {exc}") from exc
        channel = ready.channel if plan.has_init else None
        ending = Ending(ready.proc, call_plan, marker, ready.group, channel, ready.forked)
        result = _follow(ready.proc, ending, started, timeout_ms, config)
        if egress is None:
            return result
        counts = egress.close()
        return result.with_network(counts.allowed, counts.refused, counts.notice)
    finally:
        if egress is not None:
            egress.close()
        if ending is not None and ending.ends_later:
            launcher.end_later(ready, ending)
        else:
            ready.close()
            ready.group.remove()
        if not config.run_limits:
            # Launches made ahead for any run are for the worker's own limits: a run that
            # asked for its own has those made for it alone (``prepare_for_run``) or now.
            launcher.prepare(plan, config)


def _egress_for(ready: Launch, network: NetworkPolicy) -> Egress:
    """The run's proxy, listening in the launch's network namespace (that of the process that
    takes the call, which is in every namespace of the call)."""
    ready.confirm(time.monotonic() + CONFIRM_BOUND_S)
    pid = ready.forked.pid if ready.forked is not None else ready.proc.pid
    try:
        return open_egress(network, pid)
    except NoNetworkNamespace as exc:
        raise SandboxError(str(exc)) from None
    except OSError as exc:
        raise SandboxError(f"the run's network could not be set up: {exc}") from exc


def _volume_of(chosen: Plan, config: SandboxConfig, home: Path) -> tuple[int, str] | None:
    """The run's volume as a detached mount, for a launch that may have copied the host's mounts
    before the volume was there (one made for any run); None where there is nothing to hand."""
    if not (config.volume_bytes and chosen.per_run and chosen.spawned) or chosen.keep:
        return None
    if not os.path.ismount(home):
        return None
    return detached_copy(str(home)), str(home)


def _follow(
    proc: LaunchedProcess,
    ending: Ending,
    started: float,
    timeout_ms: int,
    config: SandboxConfig,
) -> SandboxResult:
    """Pump the started command's output until it ends or its time is up, end everything it
    started, and tell how it went."""
    assert proc.stdout is not None and proc.stderr is not None
    stdout = CappedStream(proc.stdout, config.output_cap_bytes)
    stderr = CappedStream(proc.stderr, config.output_cap_bytes)
    notices: tuple[tuple[int, Notice], ...] = ()
    exit_fd = ending.command_pidfd
    if ending.init_socket is not None and exit_fd is None:
        notices = ((ending.init_socket.fileno(), ending.command_started),)
    killed = False
    try:
        with Pump(proc, (stdout, stderr), notices, exit_fd) as pump:
            timed_out = not pump.until_exit(started + timeout_ms / 1000)
            if not timed_out and ending.ended_alone():
                # Nothing to kill or wait for: the answer goes now, the namespace ends after.
                pump.drain_buffered()
            else:
                ending.kill_everything()
                killed = True
                pump.drain(time.monotonic() + DRAIN_BOUND_S)
    finally:
        if not killed and not ending.ends_later:  # interrupted: nothing may be left running
            ending.kill_everything()
        returncode = ending.reap(stderr)
        stdout.close()
        stderr.close()
    return build_result(
        stdout,
        stderr,
        returncode,
        timed_out,
        timeout_ms,
        started,
        ending.plan.layers,
        ending.usage(),
        config.settings.memory_mb,
    )


def _as_argv(command: str | Sequence[str]) -> list[str]:
    return [SHELL, "-c", command] if isinstance(command, str) else list(command)


@contextlib.contextmanager
def _input_file(data: bytes | None, owner: tuple[int, int] | None) -> Iterator[str | None]:
    """``data`` in a temporary file the command's user may read (None without input). A file,
    not a pipe: the command reads it at its own pace and the worker never blocks writing it."""
    if data is None:
        yield None
        return
    _input_folder()
    fd, path = tempfile.mkstemp(prefix="toolq-input-", dir=INPUT_FOLDER)
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        if owner is not None:
            os.chown(path, *owner)
        yield path
    finally:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _input_folder() -> None:
    """The folder of the calls' inputs, made if missing: a call with private folders binds it
    back (each file is its command's uid's alone, and the folder cannot be listed)."""
    INPUT_FOLDER.mkdir(mode=0o711, exist_ok=True)


def _worker_id(config: SandboxConfig) -> str:
    return HostRegistry(config.host_state).worker_id(config.fleet())
