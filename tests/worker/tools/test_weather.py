"""get_current_weather, toolq's own plugin: its answer, and how every fleet gets it."""

from __future__ import annotations

import importlib
import json
from importlib.metadata import entry_points
from pathlib import Path

import pytest

from tests.worker.tools.conftest import assert_arguments_refused
from worker.contract.settings import WorkerSettings
from worker.manifest import fleet_tool_specs
from worker.tools.context import ToolContext
from worker.tools.plugins import ENTRY_POINT_GROUP, load_plugins, register_plugins
from worker.tools.registry import ToolRegistry
from worker.tools.weather import TOOLS, GetCurrentWeatherTool, register
from worker.tools.workspace import Workspace


@pytest.fixture
def weather() -> ToolRegistry:
    registry = ToolRegistry()
    registry.register(GetCurrentWeatherTool())
    return registry


@pytest.mark.parametrize("args", [{"location": "Boston, MA"}, '{"location": "Boston, MA"}'])
async def test_always_sunny_and_mild(weather: ToolRegistry, args: dict[str, str] | str) -> None:
    answer = json.loads(await weather.execute("get_current_weather", args))
    assert answer["location"] == "Boston, MA"
    assert answer["condition"] == "Sunny"
    assert 65 <= answer["temperature_f"] <= 75


async def test_the_same_place_gets_the_same_answer(weather: ToolRegistry) -> None:
    first = await weather.execute("get_current_weather", {"location": "Tokyo"})
    assert await weather.execute("get_current_weather", {"location": "Tokyo"}) == first


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({}, "'location': Field required"),
        ({"location": 12}, "'location': Input should be a valid string"),
        ({"location": ""}, "'location': String should have at least 1 character"),
        ({"location": "Oslo", "unit": "C"}, "'unit': unknown parameter"),
    ],
)
async def test_bad_arguments_name_the_parameter(
    weather: ToolRegistry, args: dict[str, object], message: str
) -> None:
    await assert_arguments_refused(weather, "get_current_weather", args, message)


def test_schema_describes_location() -> None:
    function = GetCurrentWeatherTool().get_schema()["function"]
    assert function["name"] == "get_current_weather"
    assert function["parameters"]["required"] == ["location"]
    assert function["parameters"]["properties"]["location"]["description"]
    assert GetCurrentWeatherTool.idempotent is True


def test_the_register_hook_adds_the_tool(workspace: Workspace) -> None:
    registry = ToolRegistry()
    register(registry, ToolContext(), workspace)
    assert registry.get_tool_names() == ["get_current_weather"]
    assert [GetCurrentWeatherTool] == TOOLS


async def test_loading_the_module_as_a_plugin_is_all_it_takes(workspace: Workspace) -> None:
    registry = ToolRegistry()
    hooks = load_plugins(("worker.tools.weather",))
    register_plugins(hooks, registry, ToolContext(), workspace)
    answer = json.loads(await registry.execute("get_current_weather", {"location": "Lima"}))
    assert answer["condition"] == "Sunny"
    assert importlib.import_module("worker.tools.weather").register is register


def test_every_fleet_serves_it_without_being_told_unless_it_is_disabled(tmp_path: Path) -> None:
    plain = WorkerSettings(workspace_root=tmp_path, plugins=[])
    specs = {spec.name: spec for spec in fleet_tool_specs(plain)}
    assert specs["get_current_weather"].enabled_by_default
    assert "worker.tools.weather" in [ep.value for ep in entry_points(group=ENTRY_POINT_GROUP)]

    refused = plain.model_copy(update={"disabled_tools": ["get_current_weather"]})
    specs = {spec.name: spec for spec in fleet_tool_specs(refused)}
    assert not specs["get_current_weather"].enabled_by_default
