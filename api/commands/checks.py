"""What every ``toolq`` command checks before it starts: its settings, the image it was given, and
that the fleet it needs answers; each failure is one line on stderr and an exit status."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

from api.settings import check_settings, get_settings
from worker.contract.run_limits import RunLimits
from worker.contract.settings_check import exit_on_bad_settings

console = Console(highlight=False)
err = Console(stderr=True, highlight=False)

#: The exit status when the configured broker or result store cannot be used.
EXIT_UNREACHABLE = 1
#: The exit status when something must be installed or set up on this host first.
EXIT_MISSING_DEPENDENCY = 3


def _refuse(message: str, status: int = 2) -> NoReturn:
    """``error: <message>`` in one line on stderr, and the command ends with ``status``."""
    err.print(f"error: {message}", markup=False, soft_wrap=True, highlight=False)
    raise typer.Exit(status)


def checked_settings() -> None:
    """Every command starts here: a setting that is wrong is named, and the command exits with
    status 2 before it starts anything. (Not in the group's callback, which would run before
    a command's --help too.)"""
    exit_on_bad_settings(check_settings)


def reachable_fleet(*, local_too: bool = False) -> None:
    """With a broker configured, it and the result store answer, or the command ends here in
    one line, with exit status 1: before the command's own (slower) imports, and before any
    conversation starts. ``local_too``: the default broker too (a worker connects to it)."""
    settings = get_settings()
    if settings.local_mode and not local_too:
        return
    from api.exceptions import FleetUnreachableError
    from api.process.connections import check_connections

    try:
        check_connections(settings)
    except FleetUnreachableError as exc:
        _refuse(str(exc), EXIT_UNREACHABLE)


def checked_image(image: str | None) -> None:
    """An image reference that cannot be one stops the command in one line, exit status 2."""
    if image is None:
        return
    from worker.contract.errors import ImageError
    from worker.contract.image_reference import parse_reference

    try:
        parse_reference(image)
    except ImageError as exc:
        _refuse(str(exc))


def checked_limits(limits: str | None) -> RunLimits | None:
    """``--limits`` as the run's own limits; one that is not well formed, or asks for more than
    TOOLQ_LIMITS_MAX_* (or TOOLQ_MAX_TIMEOUT_MS) allow, stops the command in one line, exit
    status 2, before anything runs."""
    if limits is None:
        return None
    try:
        parsed = RunLimits.parse(limits)
    except ValueError as exc:
        _refuse(f"--limits: {exc}")
    over = get_settings().limits_refusal(parsed)
    if over is not None:
        _refuse(over)
    return parsed


def checked_network(network: str | None) -> None:
    """A ``--network`` that is not one, or asks for more than TOOLQ_NETWORK_ALLOWED lets runs
    ask for, stops the command in one line, exit status 2, before anything runs."""
    if network is None:
        return
    refused = get_settings().network_refusal(network)
    if refused is not None:
        _refuse(refused)
