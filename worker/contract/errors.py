"""Why things fail, as both sides name it: the error kinds a call's answer carries, the one base
every toolq exception derives from (a caller catches toolq's refusals as one kind), and the
exceptions that cross between the two sides.

Every toolq exception derives from ``ToolqError``; those raised by one side only are in that
side's module (``worker.exceptions``, ``api.exceptions``), each with its part of the tree::

    ToolqError
     ├── ImageError (RuntimeError)        an image cannot be resolved, pulled, unpacked, started
     ├── EnvironmentLost (RuntimeError)   the run's container is gone: nothing of the call ran
     ├── FleetSecretError (ValueError)    the fleet secret cannot be had
     ├── SettingsError (ValueError)       settings that cannot be used, one line for each
     ├── McpConfigError (ValueError)      the MCP servers file cannot be used
     ├── NetworkRefused (ValueError)      a run's network not well formed, or not allowed
     ├── LimitsRefused (ValueError)       a run's limits above what the fleet allows
     ├── SessionGone (RuntimeError)       a run's shell session is no more
     │    ├── SessionLost                 its worker stopped, and the shell with it
     │    └── SessionEnded                it ended as it should (idle, its run's end)
     ├── worker.exceptions.*              the workers' own
     └── api.exceptions.*                 the orchestrator's own
"""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError


class ToolqError(Exception):
    """Base of every exception toolq raises on purpose: a refusal or fault it can explain."""


class ImageError(ToolqError, RuntimeError):
    """An image could not be resolved, pulled, unpacked or started; ``str()`` is one line
    naming the image and the cause."""

    def __init__(self, image: str, cause: str) -> None:
        super().__init__(f"image {image!r}: {cause}")
        self.image = image
        self.cause = cause


class EnvironmentLost(ToolqError, RuntimeError):
    """The run's container is gone (its worker died, it was ended, or its workspace was
    removed): nothing of the run's call ran."""


class FleetSecretError(ToolqError, ValueError):
    """The fleet secret cannot be had: the one line says which file and why."""


class SettingsError(ToolqError, ValueError):
    """Settings that cannot be used; ``problems`` holds one line for each."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


class McpConfigError(ToolqError, ValueError):
    """The servers file cannot be used; the message names the file and the entry."""


class NetworkRefused(ToolqError, ValueError):
    """A ``network`` that is not well formed, or more than the operator allows: one line."""


class LimitsRefused(ToolqError, ValueError):
    """A run asks for more than the fleet allows (``limits``); the message says what."""


#: What every line of a session that is gone ends with: the way to a new shell, which is never
#: started unasked.
RESTART_HINT = "action 'restart' starts a new shell (nothing of the old one is kept)"


class SessionGone(ToolqError, RuntimeError):
    """A run's shell session is no more: the call typed nothing. Its one line for the model says
    which session, why, and what starts a new one."""


class SessionLost(SessionGone):
    """The worker that held the session stopped, and the shell with it (``session_lost``)."""


class SessionEnded(SessionGone):
    """The session ended as it should (idle past the operator's time, its run's workspace
    removed, its shell failed to start)."""


def validation_problems(exc: ValidationError, whole: str) -> str:
    """A validation error as one line: where each problem is (``whole`` for the top level) and
    what it is."""
    return "; ".join(
        f"{'.'.join(str(part) for part in error['loc']) or whole}: {error['msg']}"
        for error in exc.errors(include_url=False)
    )


#: Why a call failed, as the registry itself tells: it knows nothing of queues or workers.
RegistryErrorKind = Literal[
    "unknown_tool",  # no tool of that name
    "tool_disabled",  # the tool exists but is switched off
    "invalid_arguments",  # malformed JSON, wrong types, missing or unknown fields
    "tool_error",  # the tool raised
    "unserializable_result",  # the tool returned something JSON cannot hold
    "timeout",  # the tool ran past its deadline and was stopped (or not waited for)
]

#: Why a call failed: the registry's kinds, then those of the layers around it.
ErrorKind = Literal[
    RegistryErrorKind,
    # The call may have run, and its outcome is unknown: its worker died mid-call (a tool with
    # effects is not run again), or no answer came although it started, or nobody could tell.
    "interrupted",
    "over_quota",  # the run's workspace is past its quota: tools that write are not started
    # The run's workspace could not be made ready (no uid left for the run, a folder the worker
    # may not use): nothing of the call ran.
    "workspace_unavailable",
    "wrong_pool",  # the call reached a worker whose pool does not serve the tool
    # The run's container (its image's) is gone: its worker died, or it was ended. Nothing of
    # the call ran.
    "environment_lost",
    # The run's shell session (bash_session) is gone with the worker that held it: the call
    # typed nothing, and no new shell was started in its place.
    "session_lost",
    "bad_request",  # the message was not a valid request
    "no_answer",  # no worker started it by the deadline (none listening, or all too busy)
    "broker_unavailable",  # the call could not be sent
]
