"""A validation error as one line: each problem's place, or the whole, and what it is."""

from __future__ import annotations

import pytest
from pydantic import BaseModel, ValidationError

from worker.contract.errors import validation_problems


class Inner(BaseModel):
    size: int


class Outer(BaseModel):
    name: str
    inner: Inner


def error_of(data: object) -> ValidationError:
    with pytest.raises(ValidationError) as caught:
        Outer.model_validate(data)
    return caught.value


def test_each_problem_names_its_place_joined_with_dots() -> None:
    problems = validation_problems(error_of({"inner": {"size": "big"}}), "config")
    assert problems == (
        "name: Field required; "
        "inner.size: Input should be a valid integer, unable to parse string as an integer"
    )


def test_a_problem_of_the_whole_is_named_as_asked() -> None:
    problems = validation_problems(error_of([1, 2]), "entry")
    assert problems.startswith("entry: ")
