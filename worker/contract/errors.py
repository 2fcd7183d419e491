"""Why things fail, as both sides name it: the error kinds a call's answer carries, and the one
base every toolq exception derives from, so a caller catches toolq's refusals as one kind."""

from __future__ import annotations

from typing import Literal

from pydantic import ValidationError


class ToolqError(Exception):
    """Base of every exception toolq raises on purpose: a refusal or fault it can explain."""


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
