"""What a task may tell the toolq sandbox: the image its samples run in, their network and limits.

``sandbox=("toolq", "python:3.12-slim")`` (any image reference), ``sandbox=("toolq",
"toolq.yaml")`` (a file, YAML or JSON, of the fields below; ``toolq.yaml`` beside the task is
found by itself, as Docker's ``compose.yaml`` is), or ``sandbox=("toolq",
ToolqSandboxConfig(image=...))``. No configuration: the workers' own file system, as before.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from inspect_ai.util import SandboxEnvironmentConfigType
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from worker.contract.errors import ImageError, validation_problems
from worker.contract.image_reference import parse_reference
from worker.contract.network import NetworkFields
from worker.contract.run_limits import LimitsFields

#: The configuration files ``toolq`` looks for beside a task, first found first.
CONFIG_FILES = ("toolq.yaml", "toolq.yml", "toolq.json")


class ToolqSandboxConfig(NetworkFields, LimitsFields):
    """A sample's sandbox: a container of ``image`` for each sample, on the toolq fleet, with
    the network ``network`` says (``NetworkFields``: "none" by default) and each sample's run's
    own ``limits`` (``LimitsFields``, as Inspect's compose resources are per sample)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    image: str | None = Field(
        None,
        min_length=1,
        description="oci:/layout:tag, oci-archive:/x.tar, docker-archive:/x.tar or a registry "
        "reference; None: the workers' own file system.",
    )
    user: str | None = Field(None, description="Who commands run as; default the image's User.")
    env: dict[str, str] = Field(default_factory=dict, description="Set over the image's Env.")
    recreate: bool = Field(
        False, description="A container lost mid-sample (its worker died) starts again."
    )


def sandbox_config(config: SandboxEnvironmentConfigType | None) -> ToolqSandboxConfig:
    """The configuration Inspect passed, read; ``ValueError`` saying what is wrong with it."""
    if config is None:
        return ToolqSandboxConfig()
    if isinstance(config, ToolqSandboxConfig):
        return config
    if isinstance(config, BaseModel):
        return _validated(config.model_dump(), type(config).__name__)
    if isinstance(config, str):
        path = Path(config)
        if path.suffix not in (".yaml", ".yml", ".json"):
            image = _as_given(config)
            return _validated({"image": image}, repr(image))
        if not path.is_file():
            raise ValueError(f"the toolq sandbox configuration file {config} does not exist")
        return _validated(_read(path), str(path))
    raise ValueError(f"the toolq sandbox does not take {config!r} as its configuration")


def _as_given(config: str) -> str:
    """The image reference a task gave, which Inspect, taking every configuration for a file,
    has put below the task's folder (``/tasks/python:3.12-slim``): the part after the longest
    folder that exists, where that part is an image reference."""
    if not config.startswith("/") or Path(config).exists():
        return config
    cuts = [i for i, c in enumerate(config) if c == "/" and i > 0]
    for cut in reversed(cuts):
        rest = config[cut + 1 :]
        # Path() made docker:// one slash.
        rest = "docker://" + rest.removeprefix("docker:/") if rest.startswith("docker:/") else rest
        if Path(config[:cut]).is_dir():
            try:
                parse_reference(rest)
            except ImageError:
                continue
            return rest
    return config


def _read(path: Path) -> Any:
    text = path.read_text()
    try:
        return json.loads(text) if path.suffix == ".json" else yaml.safe_load(text)
    except (ValueError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not valid {path.suffix[1:].upper()}: {exc}") from None


def _validated(data: Any, where: str) -> ToolqSandboxConfig:
    if isinstance(data, dict) and "services" in data:
        raise ValueError(
            f"{where} is a Docker compose file: the toolq sandbox takes an image instead, "
            "sandbox=('toolq', '<image>') or a toolq.yaml naming it"
        )
    try:
        config = ToolqSandboxConfig.model_validate(data)
    except ValidationError as exc:
        problems = validation_problems(exc, "config")
        raise ValueError(f"the toolq sandbox configuration {where}: {problems}") from None
    if config.image is not None:
        try:
            parse_reference(config.image)
        except ImageError as exc:
            raise ValueError(str(exc)) from None
    return config
