"""Tools made of plain functions: a decorated function, and a function with a JSON Schema."""

from __future__ import annotations

import asyncio
import datetime
import json
from typing import Annotated, Any

import pytest
from pydantic import BaseModel, Field

from worker.exceptions import DuplicateToolError
from worker.tools.functions import tool
from worker.tools.registry import ToolRegistry


class Point(BaseModel):
    x: int
    y: int


@tool
def plot(point: Point, label: str = "here", day: datetime.date | None = None) -> str:
    """Marks a point on the map.

    Parameters that the model fills in come from the signature.

    Args:
        point: Where to put the mark.
        label: What the mark says.
        day: When it was seen, if known.
    """
    # The values arrive as validated: the point a model, the day a date.
    assert isinstance(point, Point)
    assert day is None or isinstance(day, datetime.date)
    return f"{label} at {point.x},{point.y}" + (f" on {day:%d %b}" if day else "")


@tool(name="count_up", idempotent=True, timeout_ms=1500)
async def count(start: Annotated[int, Field(ge=0)], steps: int) -> list[int]:
    """Counts up from a number.

    :param start: The first number.
    :param steps: How many numbers.
    """
    await asyncio.sleep(0)
    return list(range(start, start + steps))


WEATHER = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "minLength": 1, "description": "The city."},
        "unit": {"type": "string", "enum": ["C", "F"], "default": "C"},
    },
    "required": ["city"],
    "additionalProperties": False,
}


def forecast(city: str, unit: str) -> dict[str, Any]:
    return {"city": city, "unit": unit, "condition": "Sunny"}


def test_the_schema_comes_from_the_hints_and_the_docstring() -> None:
    function = plot.get_schema()["function"]
    assert function["name"] == "plot"
    assert function["description"] == (
        "Marks a point on the map.\n\nParameters that the model fills in come from the signature."
    )
    parameters = function["parameters"]
    assert parameters["required"] == ["point"]
    assert parameters["additionalProperties"] is False
    assert parameters["properties"]["point"]["description"] == "Where to put the mark."
    assert parameters["properties"]["label"] == {
        "default": "here",
        "description": "What the mark says.",
        "type": "string",
    }
    counting = count.get_schema()["function"]
    assert counting["name"] == "count_up"
    assert counting["parameters"]["properties"]["start"]["minimum"] == 0
    assert counting["parameters"]["properties"]["steps"]["description"] == "How many numbers."
    assert (count.idempotent, count.default_timeout_ms, count.pool) == (True, 1500, "tools")


async def test_a_decorated_function_is_called_with_validated_values() -> None:
    registry = ToolRegistry()
    registry.register(plot)
    registry.register(count)

    plain = await registry.run("plot", {"point": {"x": 1, "y": 2}})
    dated = await registry.run(
        "plot", '{"point": {"x": 3, "y": 4}, "label": "fox", "day": "2024-05-01"}'
    )
    counted = await registry.run("count_up", {"start": 3, "steps": 3})

    assert plain.output == "here at 1,2"
    assert dated.output == "fox at 3,4 on 01 May"
    assert json.loads(counted.output) == [3, 4, 5]
    assert plot(Point(x=0, y=0), "still a function") == "still a function at 0,0"


@pytest.mark.parametrize(
    ("tool_name", "arguments", "problems"),
    [
        ("plot", {}, ["'point': Field required"]),
        ("plot", {"point": {"x": "a", "y": 1}}, ["'point.x': Input should be a valid integer"]),
        ("plot", {"point": {"x": 1, "y": 1}, "colour": "red"}, ["'colour': unknown parameter"]),
        ("count_up", {"start": -1, "steps": 2}, ["'start': Input should be greater than"]),
    ],
)
async def test_bad_arguments_of_a_function_name_the_parameter(
    tool_name: str, arguments: dict[str, Any], problems: list[str]
) -> None:
    registry = ToolRegistry()
    registry.register(plot)
    registry.register(count)

    answer = await registry.run(tool_name, arguments)

    assert answer.error_kind == "invalid_arguments"
    assert answer.output.startswith(f"Error: invalid arguments for {tool_name}: ")
    for problem in problems:
        assert problem in answer.output


async def test_a_json_schema_tool_keeps_its_schema_and_checks_each_call() -> None:
    registry = ToolRegistry()
    made = registry.register_function(
        forecast, name="forecast", description="Tomorrow's weather.", parameters=WEATHER
    )

    assert made.get_schema()["function"] == {
        "name": "forecast",
        "description": "Tomorrow's weather.",
        "parameters": WEATHER,
    }
    answer = await registry.run("forecast", {"city": "Oslo"})
    assert json.loads(answer.output) == {"city": "Oslo", "unit": "C", "condition": "Sunny"}
    bad = await registry.run("forecast", {"unit": "K", "wind": True})
    assert bad.error_kind == "invalid_arguments"
    assert bad.output.startswith("Error: invalid arguments for forecast: ")
    assert "'city': Field required" in bad.output
    assert "'unit': 'K' is not one of ['C', 'F']" in bad.output
    assert "'wind': unknown parameter" in bad.output
    wrong_type = await registry.run("forecast", '{"city": 12}')
    assert "'city': 12 is not of type 'string'" in wrong_type.output


@pytest.mark.parametrize(
    ("parameters", "message"),
    [
        ({"type": "object", "properties": {"city": {"type": "town"}}}, "properties/city/type"),
        ({"type": "object", "required": "city"}, "at required"),
        ({"type": "string"}, "must describe an object"),
        ({"type": "object", "properties": {"when": {"default": datetime.date.today()}}}, "JSON"),
        ({"type": "object", "properties": {"country": {"type": "string"}}}, "country"),
    ],
)
def test_a_schema_that_is_not_valid_is_refused_at_registration(
    parameters: dict[str, Any], message: str
) -> None:
    registry = ToolRegistry()
    with pytest.raises((ValueError, TypeError), match="tool 'forecast'") as info:
        registry.register_function(
            forecast, name="forecast", description="Weather.", parameters=parameters
        )
    assert message in str(info.value)
    assert not registry.has_tool("forecast")


def _no_hint(city) -> str:  # type: ignore[no-untyped-def]
    """Has a parameter of no type."""
    return str(city)


def _no_docs(city: str) -> str:
    return city


def _any_number(*cities: str) -> str:
    """Takes any number of cities."""
    return ",".join(cities)


@pytest.mark.parametrize(
    ("function", "traits", "message"),
    [
        (_no_hint, {}, "parameter 'city' has no type hint"),
        (_no_docs, {}, "needs a description"),
        (_any_number, {}, "name each one"),
        (lambda city: city, {"description": "A lambda."}, "'<lambda>' cannot name a tool"),
        (_no_docs, {"name": "no spaces allowed", "description": "x"}, "cannot name a tool"),
        (_no_docs, {"description": "x", "parameters": {"type": "object"}, "name": "a b"}, "name"),
    ],
)
def test_a_function_that_cannot_be_described_is_refused_with_its_reason(
    function: Any, traits: dict[str, Any], message: str
) -> None:
    with pytest.raises((TypeError, ValueError), match=message):
        ToolRegistry().register_function(function, **traits)


async def test_duplicates_and_results_json_cannot_hold_are_handled_as_for_class_tools() -> None:
    registry = ToolRegistry()

    @tool
    def opaque() -> object:
        """Returns what JSON cannot hold."""
        return object()

    registry.register(opaque)
    with pytest.raises(DuplicateToolError, match="opaque"):
        registry.register_function(opaque.function)
    with pytest.raises(DuplicateToolError, match="opaque"):
        registry.register_function(
            forecast, name="opaque", description="x", parameters={"type": "object"}
        )
    answer = await registry.run("opaque", {})
    assert answer.error_kind == "unserializable_result"
    assert json.loads(answer.output)["tool"] == "opaque"


def test_a_plain_function_given_to_register_says_what_to_use() -> None:
    with pytest.raises(TypeError, match="register_function"):
        ToolRegistry().register(forecast)  # type: ignore[arg-type]
