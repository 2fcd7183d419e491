"""Environment variables a caller sets for a command: the one rule every request that carries
them (run_bash, ``toolq.exec``, an image's start) is held to."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator


def variable_problem(name: str, value: str) -> str | None:
    """Why ``name=value`` cannot be put in a process's environment, or None when it can: the
    kernel takes ``name=value`` strings ending at a NUL, so a name holds neither '=' nor NUL, and
    a value no NUL."""
    if not name or "=" in name or "\x00" in name:
        return f"{name!r} is not a valid variable name (no '=' or NUL, not empty)"
    if "\x00" in value:
        return f"the value of {name} contains a NUL byte"
    return None


def settable_variables(env: dict[str, str]) -> dict[str, str]:
    """``env`` when a process's environment can hold every variable; else ``ValueError`` saying
    why the first cannot (a pydantic validator)."""
    for name, value in env.items():
        if problem := variable_problem(name, value):
            raise ValueError(problem)
    return env


#: Variables by name, each one a process's environment can hold.
Variables = Annotated[dict[str, str], AfterValidator(settable_variables)]
