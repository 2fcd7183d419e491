"""Settings checked before anything starts, in every ``toolq`` command and in the worker.

A ``TOOLQ_`` variable that is no setting, a value of the wrong type or a URL toolq cannot use is
named in one line each, and the process exits with status 2 before it starts anything.
pydantic-settings' ``extra="forbid"`` looks at arguments, not at the environment: without this a
misspelt variable would silently be a default (an unset broker starts a local stack).
"""

from __future__ import annotations

import difflib
import os
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TypeVar

from pydantic import ValidationError
from pydantic_settings import BaseSettings

from worker.contract.errors import SettingsError
from worker.contract.settings import (
    DEBUG_VARIABLE,
    ENV_PREFIX,
    ORCHESTRATOR_ONLY_FIELDS,
    OTHER_VARIABLES,
    WorkerSettings,
    get_worker_settings,
    setting_names,
    variable_of,
)

#: The exit status of a process whose settings are wrong.
EXIT_BAD_SETTINGS = 2

_T = TypeVar("_T")


def known_variables(
    classes: Iterable[type[BaseSettings]], fields: Iterable[str] = ()
) -> frozenset[str]:
    """The ``TOOLQ_`` variables of ``classes``' fields and of ``fields``, and the others toolq
    reads."""
    names = {name for cls in classes for name, _ in setting_names(cls)} | set(fields)
    return frozenset({f"{ENV_PREFIX}{name.upper()}" for name in names} | set(OTHER_VARIABLES))


def unknown_variables(environ: Mapping[str, str], known: Collection[str]) -> list[str]:
    """A line for each ``TOOLQ_`` variable of ``environ`` not in ``known``, naming the closest
    known one. Names are compared upper-cased, as pydantic-settings reads them."""
    problems = []
    for name in sorted(environ):
        upper = name.upper()
        if not upper.startswith(ENV_PREFIX) or upper in known:
            continue
        close = difflib.get_close_matches(upper, sorted(known), n=1, cutoff=0.6)
        hint = (
            f"did you mean {close[0]}?"
            if close
            else "the settings are in docs/reference/settings.md"
        )
        problems.append(f"{name} is not a toolq setting; {hint}")
    return problems


def validation_problems(exc: ValidationError) -> list[str]:
    """A line for each value pydantic refused, naming its variable."""
    problems = []
    for error in exc.errors(include_url=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["loc"]:
            message = f"{variable_of(error['loc'])}: {message}"
        problems.append(message)
    return problems


def settings_problems(
    classes: Iterable[type[BaseSettings]], *, fields: Iterable[str] = ()
) -> list[str]:
    """What is wrong with the settings ``classes`` read from the environment: unknown variables
    (``fields`` names settings read elsewhere, known too), then refused values."""
    classes = list(classes)
    problems = unknown_variables(os.environ, known_variables(classes, fields))
    for cls in classes:
        try:
            cls()
        except ValidationError as exc:
            problems += validation_problems(exc)
    # The fleet's settings are in every class: a bad one is named once.
    return list(dict.fromkeys(problems))


def debugging() -> bool:
    """``TOOLQ_DEBUG=1``: errors keep their traceback."""
    return os.environ.get(DEBUG_VARIABLE, "") not in ("", "0")


def exit_on_bad_settings(check: Callable[[], _T]) -> _T:
    """What ``check`` returns; if it raises ``SettingsError``, its problems on stderr and exit
    status 2 (with ``TOOLQ_DEBUG`` set, the error is raised as it is)."""
    try:
        return check()
    except SettingsError as exc:
        if debugging():
            raise
        for problem in exc.problems:
            print(f"error: {problem}", file=sys.stderr)
        raise SystemExit(EXIT_BAD_SETTINGS) from None


def checked_worker_settings() -> WorkerSettings:
    """A worker's settings, once the environment holds nothing wrong for a worker.

    The orchestrator's settings are known too: workers are often started with its environment.
    """
    problems = settings_problems([WorkerSettings], fields=ORCHESTRATOR_ONLY_FIELDS)
    if problems:
        raise SettingsError(problems)
    return get_worker_settings()
