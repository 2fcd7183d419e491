"""Running one shell command in isolation, with its output capped while it is read.

Layers, strongest last: the command runs in a session of its own with a minimal environment,
and everything it started is killed when it ends. Where the worker may make control groups, the
command and everything it starts are in a group of their own from the first instruction: a
process limit and a memory limit per call, its CPU counted, and the whole tree killed and counted
at once. When the worker is root it runs as an unprivileged user under resource limits, without
a way to gain privileges. Where the machine allows it (see ``describe_isolation``), it gets
private PID and network namespaces: nothing it starts outlives it and it cannot reach the network
or see other processes.

The parts: ``config`` (what the sandbox is told), ``cgroup_layout`` (which hierarchy does which
job on this machine), ``call_cgroup`` (one call's groups), ``start`` (every way a command is
started, in one folder: see its docstring), ``layers`` (the layers, which of them this machine
gives, and the user and the programs a plan needs), ``plan`` (the command line that sets them
up), ``identity`` (a uid per run), ``uid_leftovers`` (what a run leaves where no namespace
collects it), ``volumes`` (a file system per run), ``output`` (the capped streams and the pump
reading them), ``pidfd`` (an exit status told through a pidfd), ``ending`` (killing, reaping,
counting, or letting a command that ended alone answer before its namespace ends), ``result``
(what a run tells and what it used), ``sweep`` (finding what dead worker processes left), and
``command`` (one command from start to end).
"""

from worker.contract.sandbox_settings import SandboxSettings
from worker.exceptions import SandboxError
from worker.sandbox.command import CommandCall, run_sandboxed
from worker.sandbox.config import SAFE_PATH, SHELL, Isolation, SandboxConfig
from worker.sandbox.layers import LAYER_PID_NS, describe_isolation
from worker.sandbox.result import SandboxResult
from worker.sandbox.sweep import sweep_orphans

__all__ = [
    "LAYER_PID_NS",
    "SAFE_PATH",
    "SHELL",
    "CommandCall",
    "Isolation",
    "SandboxConfig",
    "SandboxError",
    "SandboxResult",
    "SandboxSettings",
    "describe_isolation",
    "run_sandboxed",
    "sweep_orphans",
]
