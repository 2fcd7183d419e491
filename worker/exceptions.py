"""Every exception the workers raise on purpose, in one place: the tree below is what can be
raised and what catches what. All derive from ``worker.contract.errors.ToolqError``, whose module
holds the exceptions that cross between the two sides (``ImageError``, ``EnvironmentLost``, ...);
these reach the orchestrator only as an answer's error kind and text, but for the tool
model's (``DuplicateToolError``), which it runs too. (Private exceptions stay in the modules they
never leave: ``images.cache._LayerGone``.)

::

    ToolqError
     │  the sandbox (worker.sandbox)
     ├── SandboxError (RuntimeError)            the sandbox cannot run commands as configured
     ├── HostRegistryError (RuntimeError)       the host's registry cannot be used
     ├── IdentityError (RuntimeError)           no uid can be given to a run
     ├── NoNetworkNamespace (RuntimeError)      a run's network asked where no namespace holds it
     │  images (worker.images)
     ├── MountError (OSError)                   a mount the container needs could not be made
     ├── TooLarge (ValueError)                  an image's layers unpack past the bound
     ├── BadEntry (ValueError)                  an entry of a layer that is not unpacked
     ├── NodeNameTaken                          another live sandbox worker has this node name
     ├── RuntimeFailed (RuntimeError)           the OCI runtime refused or failed
     ├── ImageError (contract)
     │    └── RegistryUnreachable               the registry did not answer
     │  tools (worker.tools)
     ├── WorkspaceError (ValueError)            a path a tool cannot use
     │    └── PathNotFoundError                 inside the workspace, but nothing is there
     ├── DuplicateToolError (ValueError)        a tool of that name is registered already
     ├── SearchTimeUp                           a search spent its time budget
     ├── WorkspaceGone                          the workspace went before the call held it
     │  a call's way through the worker
     ├── NotAdmitted                            the call must not start (answered, or cut off)
     ├── NotRunHere                             this delivery neither ran nor answered its call
     ├── TimeLimitReached                       raised into a tool at its soft time limit
     ├── ToolCallFailed                         a call answered with an error
     ├── PluginError (RuntimeError)             a configured plugin cannot be loaded
     │  MCP servers (worker.mcp)
     ├── ServerUnavailableError (RuntimeError)  the server is not running
     ├── ServerStoppedError (RuntimeError)      it stopped with the call in flight
     ├── McpUnavailableError (RuntimeError)     servers configured, no ``mcp`` package
     └── McpToolError (RuntimeError)            the server answered the call with an error

It imports nothing of toolq's but the contract's errors: any module may import it, the tool
model too (so the orchestrator, which imports the tool model, may catch ``DuplicateToolError``).
"""

from __future__ import annotations

from worker.contract.errors import ImageError, ToolqError


class SandboxError(ToolqError, RuntimeError):
    """The sandbox cannot run commands as configured; the message says why."""


class HostRegistryError(ToolqError, RuntimeError):
    """The host's registry cannot be used; the message says why and what to set."""


class IdentityError(ToolqError, RuntimeError):
    """No uid can be given to a run: the range is full or its claims cannot be written."""


class NoNetworkNamespace(ToolqError, RuntimeError):
    """The command would share the worker's network: no list can hold it there."""


class MountError(ToolqError, OSError):
    """A mount the container needs could not be made; the message says which and why."""


class TooLarge(ToolqError, ValueError):
    """The layers unpack to more than the bound: ``counted`` is how far the count got."""

    def __init__(self, counted: int) -> None:
        super().__init__(counted)
        self.counted = counted


class BadEntry(ToolqError, ValueError):
    """An entry of a layer that is not unpacked: the message says which and why."""


class NodeNameTaken(ToolqError):
    """Another live sandbox worker runs under this node name."""


class RuntimeFailed(ToolqError, RuntimeError):
    """The OCI runtime refused or failed; the message is its own complaint, in one line."""


class RegistryUnreachable(ImageError):
    """The registry did not answer: no connection, a timeout, or a 5xx (not a refusal, nor an
    unknown tag, which are its answers)."""


class WorkspaceError(ToolqError, ValueError):
    """A path a tool cannot use; the message tells the model which path and why."""


class PathNotFoundError(WorkspaceError):
    """The path lies inside the workspace but nothing is there."""


class DuplicateToolError(ToolqError, ValueError):
    """A tool with this name is registered already."""


class SearchTimeUp(ToolqError):
    """The search spent its time budget."""


class WorkspaceGone(ToolqError):
    """The workspace folder was removed (or replaced) before the call could hold it."""


class NotAdmitted(ToolqError):
    """The call must not start: it was answered before, or started on a worker that stopped
    mid-call. The executor gives the answer."""


class NotRunHere(ToolqError):
    """This delivery neither ran nor answered its call, which another holds: a message of the
    call that started it (the caller sent the call again), or the caller, which stopped waiting."""


class TimeLimitReached(ToolqError):
    """Raised into a running tool when its soft time limit passes (mapped from Celery's)."""


class ToolCallFailed(ToolqError):
    """A call answered with an error; its one argument is the outcome's summary."""


class PluginError(ToolqError, RuntimeError):
    """A configured plugin cannot be loaded: the worker refuses to start half-equipped."""


class ServerUnavailableError(ToolqError, RuntimeError):
    """The server is not running: it never started, or it stopped and has not started again."""


class ServerStoppedError(ToolqError, RuntimeError):
    """The server stopped while the call was in flight: the call's outcome is unknown."""


class McpUnavailableError(ToolqError, RuntimeError):
    """TOOLQ_MCP_SERVERS is set where the ``mcp`` package is not installed."""


class McpToolError(ToolqError, RuntimeError):
    """The server answered the call with an error (``isError``); the message is its text."""
