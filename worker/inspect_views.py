"""What Celery's inspect commands show of the calls a worker holds: their summary, never their
payload.

Celery answers ``celery inspect active``, ``reserved``, ``scheduled`` and ``query_task`` (and
Flower's worker pages, which ask the same) with each task's arguments as they came, unless asked
for ``--safe`` output; a call's arguments hold whole files, its run's ``env`` values, secrets a
user passed on. These commands are registered again here, in place of Celery's, and always
answer with the summary the caller put in the message (``argsrepr``: the tool and the run, see
``api.calls.publishing``). Imported by the worker (``worker.tasks``) before it takes any command.
"""

from __future__ import annotations

from typing import Any

from celery.utils.functional import maybe_list
from celery.worker import control
from celery.worker import state as worker_state
from celery.worker.request import Request


def _summary(request: Request) -> dict[str, Any]:
    return request.info(safe=True)  # type: ignore[no-any-return]


@control.inspect_command(alias="dump_active")  # type: ignore[untyped-decorator]
def active(state: Any, safe: bool = True, **_: Any) -> list[dict[str, Any]]:
    """List of tasks currently being executed, as their summaries."""
    return [_summary(request) for request in state.tset(worker_state.active_requests)]


@control.inspect_command(alias="dump_reserved")  # type: ignore[untyped-decorator]
def reserved(state: Any, **_: Any) -> list[dict[str, Any]]:
    """List of currently reserved tasks, not including active ones, as their summaries."""
    held = state.tset(worker_state.reserved_requests) - state.tset(worker_state.active_requests)
    return [_summary(request) for request in held]


@control.inspect_command()  # type: ignore[untyped-decorator]
def scheduled(state: Any, **_: Any) -> list[dict[str, Any]]:
    """List of tasks held for a later time, as their summaries."""
    found = []
    for waiting in state.consumer.timer.schedule.queue:
        args = getattr(waiting.entry, "args", None) or ()
        if args and isinstance(args[0], Request):
            eta = args[0].eta
            found.append(
                {
                    "eta": eta.isoformat() if eta else None,
                    "priority": waiting.priority,
                    "request": _summary(args[0]),
                }
            )
    return found


@control.inspect_command(  # type: ignore[untyped-decorator]
    variadic="ids", signature="[id1 [id2 [... [idN]]]]"
)
def query_task(state: Any, ids: Any, **_: Any) -> dict[str, Any]:
    """The state and summary of the tasks with these ids that this worker holds."""
    return {
        request.id: (control._state_of_task(request), _summary(request))
        for request in control._find_requests_by_id(maybe_list(ids))
    }
