"""Every exception the orchestrator raises on purpose, in one place: the tree below is what can be
raised and what catches what. All derive from ``worker.contract.errors.ToolqError``, whose module
holds the exceptions that cross between the two sides; the workers' own are in
``worker.exceptions``.

::

    ToolqError
     │  the model (api.model)
     ├── ModelError                          a model request failed for good
     ├── UnusableAnswer                      a 200 that is no usable chat completion
     │  the conversation (api.conversation)
     ├── LimitReached                        a limit ended it; ``message`` is its closing answer
     │  calls and the fleet (api.calls, api.process, api.agents)
     ├── NoWorkersError (RuntimeError)       no worker has published its tools
     ├── FleetUnreachableError (RuntimeError) the broker or the result store cannot be used
     ├── NoAgentsError (RuntimeError)        no agents worker is live
     ├── AgentsWorkerError (RuntimeError)    an agents worker cannot start as configured
     │  a run's workspace and container (api.runs)
     ├── ImageUnavailable (RuntimeError)     the run's container could not be started
     ├── ServiceCallError (RuntimeError)     a service operation was not carried out
     ├── FileProblemError (RuntimeError)     a path the operation could not use
     │  batches (api.batch)
     ├── TaskFailed                          an item's task could not go on
     ├── OutputBusyError (RuntimeError)      another batch appends to this output file
     ├── NotABatchRecord (ValueError)        a JSON object that is no batch result line
     │  the HTTP API (api.http, api.state)
     ├── CapReached                          a tenant asked for more than its cap leaves
     ├── TokensFileError (ValueError)        a tokens file toolq cannot use
     ├── BodyTooLarge (HTTPException)        a request body over the limit: 413
     │  elsewhere
     ├── LocalStackError (RuntimeError)      the local stack did not come up
     └── ToolqSandboxError (RuntimeError)    the fleet refused an Inspect sandbox operation

Three stay beside what they carry, drawn here all the same: ``BodyTooLarge`` in ``api.http.auth``
(its base is FastAPI's ``HTTPException``: importing FastAPI here would load it into every
orchestrator process, the batch command's too), ``LimitReached`` in ``api.conversation.limits``
and ``CapReached`` in ``api.state.tenant_caps`` (each carries a type of its folder's own,
``StopReason``, ``Cap``: importing it here would make this module and that folder import each
other).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from worker.contract.errors import ErrorKind, ToolqError

if TYPE_CHECKING:
    from worker.contract import operations


class ModelError(ToolqError):
    """A model request failed for good: refused, or still failing after the last attempt."""

    def __init__(self, message: str, *, attempts: int = 0, status: int | None = None) -> None:
        super().__init__(message)
        self.attempts = attempts
        self.status = status


class UnusableAnswer(ToolqError):
    """The provider answered 200 with something that is not a usable chat completion."""


class NoWorkersError(ToolqError, RuntimeError):
    """No worker has published its tools: start workers, or run without a broker (local mode)."""


class FleetUnreachableError(ToolqError, RuntimeError):
    """The broker or the result store cannot be used; the message says which, why, and what to
    check."""


class NoAgentsError(ToolqError, RuntimeError):
    """No agents worker is live to run conversations."""


class AgentsWorkerError(ToolqError, RuntimeError):
    """An agents worker cannot start as configured."""


class ImageUnavailable(ToolqError, RuntimeError):
    """The run's container could not be started; ``str()`` is one line naming the image and
    the cause."""


class ServiceCallError(ToolqError, RuntimeError):
    """A service operation was not carried out: nobody serves it, nobody answered, or the worker
    refused the call. ``kind`` is the call's error kind."""

    def __init__(self, message: str, kind: ErrorKind | None = None) -> None:
        super().__init__(message)
        self.kind = kind


class FileProblemError(ToolqError, RuntimeError):
    """A path the operation could not use; ``kind`` says why."""

    def __init__(self, kind: operations.FileProblem, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class TaskFailed(ToolqError):
    """The task could not go on; the item ends with status error and this message."""


class OutputBusyError(ToolqError, RuntimeError):
    """Another batch is appending to this output file right now."""


class NotABatchRecord(ToolqError, ValueError):
    """A JSON object that is no result line: it has no id."""


class TokensFileError(ToolqError, ValueError):
    """A tokens file toolq cannot use; the message is one line naming where and what."""


class LocalStackError(ToolqError, RuntimeError):
    """The local stack did not come up; the message carries the failing part's log."""


class ToolqSandboxError(ToolqError, RuntimeError):
    """The fleet refused an operation: the message is the worker's."""
