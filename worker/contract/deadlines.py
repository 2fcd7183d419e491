"""A call's time limit, by one rule wherever the tool runs: the caller's override, else the limit
the call's own arguments set (run_bash's ``timeout``, plus time to report), else the tool's
default, else the fleet's (``TOOLQ_DEFAULT_TIMEOUT_MS``); never above ``TOOLQ_MAX_TIMEOUT_MS``."""

from __future__ import annotations

import json
import math
from typing import Any, Required, TypedDict, Unpack

from worker.contract.run_limits import RunLimits
from worker.contract.settings import FleetSettings
from worker.contract.wire import ToolCallRequest, ToolContextSnapshot, ToolSpec

#: Beyond a limit the call's arguments set: time for the tool to stop itself and report.
REPORT_MARGIN_MS = 1000
#: A ``toolq.exec`` command's own time limit when its caller sets none.
EXEC_TIMEOUT_MS = 30_000
#: A ``toolq.start_environment`` call's limit when its caller sets none: a first pull of a
#: large image is slow.
START_ENVIRONMENT_TIMEOUT_MS = 300_000
#: How long ending a run's container (``toolq.end_environment``) may take.
END_ENVIRONMENT_TIMEOUT_MS = 30_000


def argument_limit_ms(
    timeout_argument: str | None, arguments: str | dict[str, Any] | None
) -> int | None:
    """The limit the call sets through the tool's ``timeout_argument``, with time to report."""
    if not timeout_argument:
        return None
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return None
    value = arguments.get(timeout_argument) if isinstance(arguments, dict) else None
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value + REPORT_MARGIN_MS
    return None


def call_limit_ms(
    settings: FleetSettings,
    *,
    override: int | None,
    timeout_argument: str | None,
    arguments: str | dict[str, Any] | None,
    tool_default_ms: int | None,
) -> int:
    """The call's limit in milliseconds, clamped to the fleet's maximum (the arguments are
    read only when no override decides it)."""
    limit = (
        override
        or argument_limit_ms(timeout_argument, arguments)
        or tool_default_ms
        or settings.default_timeout_ms
    )
    return min(max(limit, 1), settings.max_timeout_ms)


class CallFields(TypedDict, total=False):
    """What the caller of one call gives: its ids, its arguments, the run's context, and a time
    limit of its own (``build_request``, wherever the call goes)."""

    task_id: Required[str]
    run_id: Required[str]
    arguments: Required[str | dict[str, Any]]
    tool_call_id: str | None
    context: ToolContextSnapshot | None
    timeout_ms: int | None


def limited_request(
    settings: FleetSettings,
    spec: ToolSpec,
    *,
    now: float,
    wait_beyond_limit_s: float = 0.0,
    reply_to: str | None = None,
    limits: RunLimits | None = None,
    **call: Unpack[CallFields],
) -> ToolCallRequest:
    """A request for ``spec`` whose limit follows the rule above; nobody waits for its answer
    past ``now`` plus that limit plus ``wait_beyond_limit_s`` (the time a queue and a reply
    take, where there are any)."""
    arguments = call["arguments"]
    limit = call_limit_ms(
        settings,
        override=call.get("timeout_ms"),
        timeout_argument=spec.timeout_argument,
        arguments=arguments,
        tool_default_ms=spec.default_timeout_ms,
    )
    if limits is not None and limits.timeout_s is not None:
        # The run's time limit bounds each call; a command stops itself at it and reports.
        limit = min(limit, math.ceil(limits.timeout_s * 1000) + REPORT_MARGIN_MS)
    return ToolCallRequest(
        task_id=call["task_id"],
        tool_call_id=call.get("tool_call_id"),
        run_id=call["run_id"],
        tool=spec.name,
        arguments=arguments,
        context=call.get("context") or ToolContextSnapshot(),
        timeout_ms=limit,
        deadline=now + limit / 1000 + wait_beyond_limit_s,
        reply_to=reply_to,
        limits=limits,
    )
